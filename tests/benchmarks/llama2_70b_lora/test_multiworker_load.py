"""Checkpoint loading with the model axis across processes: two MultiWorkerMirroredStrategy
workers on 127.0.0.1 (one replica each, `--model_parallel=2`) load the imported base checkpoint
before `run_start`; each reads from the files only the slices it holds (elements counted at
`SuiteCheckpoint.read`), and its shards equal the single-process load's whole tensors cut along
the split axis. Every wait is bounded (collectives 60 s, each worker 240 s); workers are killed
by pid."""

import numpy as np
import pytest

from benchmarks.llama2_70b_lora import checkpoint
from benchmarks.llama2_70b_lora import model as model_lib
from tests import processes
from tests.benchmarks.llama2_70b_lora.hf_checkpoints import write_hf_checkpoint
from tests.benchmarks.llama2_70b_lora.load_worker import config as worker_config
from tests.benchmarks.llama2_70b_lora.load_worker import is_base_weight

pytestmark = [pytest.mark.slow]

TIMEOUT_S = 240


@pytest.mark.parametrize("fused", [True, False], ids=["mlcommons_fused_qkv", "hugging_face"])
def test_each_worker_reads_only_its_shards_and_they_equal_the_whole_load(tmp_path, fused):
    base_dir = str(tmp_path / "base")
    model_config = worker_config(base_dir).model
    write_hf_checkpoint(str(tmp_path / "src"), model_config, fused=fused, seed=5)
    checkpoint.import_checkpoint(str(tmp_path / "src"), base_dir, model_config)

    processes.run_workers(
        lambda index: ["-m", "tests.benchmarks.llama2_70b_lora.load_worker", base_dir,
                       str(tmp_path / f"w{index}.npz")],
        tmp_path, TIMEOUT_S,
    )  # fmt: skip
    workers = [np.load(tmp_path / f"w{index}.npz") for index in range(2)]

    # The single-process load: whole tensors.
    config = worker_config(base_dir)
    whole_model = model_lib.build_model(config.model, config.lora)
    model_lib.load_base(whole_model, base_dir, config.model)
    whole = {v.path.split("/", 1)[1]: v.numpy() for v in whole_model.variables if is_base_weight(v)}
    checkpoint_elements = sum(a.size for a in whole.values())
    split_seen = 0
    for index, w in enumerate(workers):
        held = 0
        names = [k for k in w.files if k.startswith("path_")]
        assert len(names) == len(whole)
        for key in names:
            i = key.split("_", 1)[1]
            path, value, axis = str(w[key]), w[f"value_{i}"], int(w[f"axis_{i}"])
            held += value.size
            if axis < 0:
                want = whole[path]
            else:
                split_seen += 1
                want = np.split(whole[path], 2, axis=axis)[index]
            np.testing.assert_array_equal(value, want, err_msg=path)
        # It read exactly what it holds, and that is less than the checkpoint.
        assert int(w["read_elements"]) == held
        assert held < checkpoint_elements
    # qkv (or q, k, v), o, gate, up, down, the embedding and the output layer are split.
    assert split_seen >= 2 * (5 * config.model.num_hidden_layers + 2)
