"""detaug.sample_rows: per-sample rows made when read equal the rows sliced up front, are views
of the joined arrays, and read as lists (indexing, slicing, equality, ``+``, pickling); chained
sequences read as their items end to end."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from detaug.sample_rows import Chained, SampleRows, row_ends


@pytest.fixture
def joined():
    counts = [2, 0, 3, 1]
    n = sum(counts)
    columns = {"boxes": np.arange(n * 4, dtype=np.float32).reshape(n, 4), "labels": np.arange(n, dtype=np.int64) + 7,
               "track": np.arange(n, dtype=np.int64) * 10}
    return counts, columns


def _eager(columns, counts, name):
    ends = np.cumsum(counts)
    return [columns[name][e - c:e] for c, e in zip(counts, ends)]


def test_rows_equal_the_slices_made_up_front_and_are_views(joined):
    counts, columns = joined
    for name in columns:
        rows = SampleRows(columns, counts, name)
        want = _eager(columns, counts, name)
        assert len(rows) == len(counts)
        for got, expected in zip(rows, want, strict=True):
            assert got.dtype == expected.dtype and got.shape == expected.shape
            np.testing.assert_array_equal(got, expected)
            assert got.size == 0 or np.shares_memory(got, columns[name])
    assert [len(r) for r in SampleRows(columns, counts, "boxes")] == counts
    assert row_ends(counts) == [2, 2, 5, 6]
    shared = SampleRows(columns, name="labels", ends=row_ends(counts))  # ends shared by several sequences
    assert [a.tolist() for a in shared] == [a.tolist() for a in SampleRows(columns, counts, "labels")]


def test_rows_without_a_name_are_dicts_of_every_column(joined):
    counts, columns = joined
    fields = {k: v for k, v in columns.items() if k == "track"}
    rows = SampleRows(fields, counts)
    assert [list(d) for d in rows] == [["track"]] * len(counts)
    np.testing.assert_array_equal(rows[2]["track"], [20, 30, 40])
    assert list(SampleRows({}, counts)) == [{}] * len(counts)


def test_rows_index_slice_compare_and_add_as_lists(joined):
    counts, columns = joined
    rows = SampleRows(columns, counts, "labels")
    as_list = _eager(columns, counts, "labels")
    np.testing.assert_array_equal(rows[-1], as_list[-1])
    assert [a.tolist() for a in rows[1:3]] == [a.tolist() for a in as_list[1:3]]
    with pytest.raises(IndexError):
        rows[len(counts)]
    with pytest.raises(IndexError):
        rows[-len(counts) - 1]
    assert isinstance(rows + [], list) and len(rows + rows) == 2 * len(counts)
    added = ["first"] + rows
    assert isinstance(added, list) and added[0] == "first" and len(added) == 1 + len(counts)
    np.testing.assert_array_equal(added[3], as_list[2])
    ints = SampleRows({"n": np.arange(3)}, [1, 1, 1], "n")
    assert ints == [np.array([0]), np.array([1]), np.array([2])]  # element-wise, as a list of 1-element arrays
    assert ints != [np.array([0]), np.array([1])]
    assert (ints == "abc") is False


def test_rows_pickle_and_chain(joined):
    counts, columns = joined
    rows = SampleRows(columns, counts, "boxes")
    back = pickle.loads(pickle.dumps(rows))
    assert [a.tolist() for a in back] == [a.tolist() for a in rows]
    second = SampleRows({"boxes": columns["boxes"][:1]}, [1], "boxes")
    chain = Chained([rows, second, []])
    assert len(chain) == len(counts) + 1
    assert [a.tolist() for a in chain] == [a.tolist() for a in [*rows, *second]]
    assert chain[-1].tolist() == columns["boxes"][:1].tolist()
    assert [a.tolist() for a in chain[3:5]] == [rows[3].tolist(), second[0].tolist()]
    assert len(Chained([])) == 0 and list(Chained([[], []])) == []
