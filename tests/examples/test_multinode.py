"""examples/torch_ddp_train.py across two "nodes" on one host: two torchrun launchers with
``--nnodes=2 --nproc-per-node=1`` meeting at a c10d rendezvous on localhost (gloo, CPU).

Each launcher is a node (``--node-rank`` 0 and 1); the world is their 2 processes, so the
loader must shard, pad and seed exactly as on one node. The dataset is generated once with
:mod:`detaug.synthetic` and both nodes read it at the same path (docs/distributed.md, "Several
nodes"). With 13 images, 2 ranks and batch 4: every rank holds ceil(13 / 2) = 7 samples per
epoch in 2 steps, and the union of an epoch is the whole dataset, one image repeated (padding
repeats the start of the epoch's order).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

from tests.examples.test_ddp import BATCH, EXAMPLE, NUM_IMAGES, REPO, WORLD, check_exact_epochs, needs_gloo

NODES, EPOCHS = WORLD, 2  # one process a node: the world of test_ddp.py
TIMEOUT_S = 90

pytestmark = needs_gloo


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_nodes(tmp: Path) -> list[dict]:
    """Start node 0 and node 1 (one process each), wait for both; returns the ranks' logs."""
    from detaug.synthetic import write_voc_dataset

    voc = tmp / "voc"
    write_voc_dataset(voc, num_images=NUM_IMAGES, size=((160, 320), (160, 320)), max_objects=4, seed=0)
    log_dir = tmp / "logs"
    endpoint, run_id = f"localhost:{free_port()}", f"detaug-test-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.pop("RANK", None), env.pop("WORLD_SIZE", None), env.pop("LOCAL_RANK", None)
    nodes = []
    for node_rank in range(NODES):
        command = [
            sys.executable, "-m", "torch.distributed.run", f"--nnodes={NODES}", f"--node-rank={node_rank}",
            "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}",
            "--max-restarts=0", str(EXAMPLE), "--model", "tiny", "--device", "cpu", "--backend", "gloo",
            "--size", "64", "--batch-size", str(BATCH), "--epochs", str(EPOCHS), "--voc", str(voc),
            "--log-dir", str(log_dir),
        ]
        nodes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for node in nodes:
            out, _ = node.communicate(timeout=TIMEOUT_S)
            outputs.append(out)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    for node_rank, (node, out) in enumerate(zip(nodes, outputs)):
        assert node.returncode == 0, f"node {node_rank} exited {node.returncode}:\n{out[-6000:]}"
    return [json.loads((log_dir / f"rank{r}.json").read_text()) for r in range(NODES)]


def test_two_nodes_have_exact_epochs(tmp_path: Path) -> None:
    logs = run_two_nodes(tmp_path)
    assert [log["rank"] for log in logs] == [0, 1] and all(log["world_size"] == NODES for log in logs)
    check_exact_epochs(logs, EPOCHS)
