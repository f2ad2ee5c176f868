"""converters.report: counting by reason, the accounting invariants, the summary."""

from __future__ import annotations

import pytest

from converters import report as R
from converters.report import Report


def test_skipped_image_counts_its_objects() -> None:
    report = Report(images_total=2, images_converted=1, objects_total=3, objects_converted=3)
    report.skip_image(R.IMAGE_NOT_FOUND, "Annotations/a.xml", "no a.jpg", objects=4)
    assert report.images_skipped == {R.IMAGE_NOT_FOUND: 1}
    assert report.objects_skipped == {R.OBJECT_OF_SKIPPED_IMAGE: 4}
    assert report.objects_total == 7
    assert report.skipped_total == 5
    report.check()


def test_check_catches_unbalanced_counts() -> None:
    report = Report(images_total=2, images_converted=1)
    with pytest.raises(RuntimeError, match="does not add up"):
        report.check()


def test_summary_lists_reasons_by_count() -> None:
    report = Report(images_total=3, images_converted=3, objects_total=4, objects_converted=1,
                    categories=2)
    report.skip_object(R.ZERO_SIZE_BOX, "a.xml", "object 1")
    report.skip_object(R.ZERO_SIZE_BOX, "b.xml", "object 2")
    report.skip_object(R.UNKNOWN_LABEL, "b.xml", "object 3: 'x'")
    report.warn(R.BOX_CLIPPED, "c.xml", "object 1")
    report.ignore(R.NOT_XML_FILE, "desktop.ini")
    summary = report.summary()
    assert "images:      3 converted, 0 skipped, of 3" in summary
    assert "annotations: 1 converted, 3 skipped, of 4 objects" in summary
    assert "categories:  2" in summary
    lines = summary.splitlines()
    objects_at = lines.index("skipped objects:")
    assert lines[objects_at + 1].split() == ["2", "zero-size", "box"]
    assert "warnings:" in lines and "ignored files:" in lines


def test_details_limits_per_reason() -> None:
    report = Report()
    for i in range(7):
        report.warn(R.BOX_CLIPPED, f"{i}.xml", "object 1")
    text = report.details(per_reason=5)
    assert text.count("box clipped") == 6  # 5 messages + the "... and 2 more" line
    assert "... and 2 more 'box clipped to the image'" in text
    assert report.details(None).count("\n") == 6
    assert str(report.messages[0]) == "0.xml: warning: box clipped to the image (object 1)"
    assert report.messages_of("warning", R.BOX_CLIPPED) == report.messages
