"""The save oracle: the folders megatron-bridge 0.6.2's own writer (save_hf_pretrained, save_hf_weights with
distributed_save) makes from the sharded model are the source again, and planted writer bugs are named by file and
tensor (convcheck.mutants.writer). Every case runs the real bridge under torchrun."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from convcheck.ckpt.written import prove_written
from convcheck.fixtures.build import build_fixture
from convcheck.hf.checkpoint import open_checkpoint
from tests.support.helpers import CliResult, run_cli

PRETRAINED = "save_hf_pretrained"
DISTRIBUTED = "save_hf_weights(distributed_save, save_every_n_ranks=1)"
WEIGHTS = "save_hf_weights"
_HOOK = "convcheck.mutants.writer:"


def _save(tmp_path: Path, model: str, *args: str) -> tuple[CliResult, dict]:
    res = run_cli("verify", "--model", model, *args, "--oracle", "save", "--table", "none", tmp_path=tmp_path)
    assert res.report is not None, res.err[-3000:]
    assert [o["name"] for o in res.report["oracles"]] == ["save"]
    return res, res.report["oracles"][0]


def _tensors(model: str) -> int:
    return len(open_checkpoint(build_fixture(model)).tensors)


def _only(oracle: dict) -> list[tuple[str, str]]:
    return [(f["tensor"], f["kind"]) for f in oracle["findings"]]


@pytest.mark.ranks
@pytest.mark.parametrize(
    ("model", "args", "second"),
    [
        ("tiny:qwen2-tied", ("--tp", "2"), DISTRIBUTED),
        ("tiny:qwen3-moe", ("--tp", "2", "--ep", "2"), DISTRIBUTED),
        ("tiny:llama", ("--pp", "2"), DISTRIBUTED),
        ("tiny:qwen3", ("--tp", "2", "--pp", "2"), "save_hf_weights(distributed_save, save_every_n_ranks=2)"),
    ],
    ids=["qwen2-tied-tp2", "qwen3-moe-tp2ep2", "llama-pp2", "qwen3-tp2pp2"],
)
def test_the_bridge_writer_reproduces_the_source(model: str, args: tuple[str, ...], second: str, tmp_path) -> None:
    res, save = _save(tmp_path, model, *args)
    assert res.code == 0 and save["verdict"] == "pass" and save["findings"] == [], res.out[-3000:]
    assert save["checked"] == 2 * _tensors(model)  # every source tensor, in both folders
    metrics = save["metrics"]
    assert set(metrics) == {PRETRAINED, second}
    shards = len({e.file for e in open_checkpoint(build_fixture(model)).tensors.values()})
    assert metrics[PRETRAINED]["files"] == metrics[second]["files"] == shards  # the source's shard layout
    assert metrics[PRETRAINED]["logits_max_abs_error"] == 0.0
    assert "added_files" not in metrics[PRETRAINED]  # the fixture's tokenizer is carried over, nothing invented


@pytest.mark.local_spec("the expected findings of the local layout")
@pytest.mark.ranks
def test_a_cast_is_exactly_the_source_cast(tmp_path: Path) -> None:
    """--save-dtype bf16 on Moonlight (bf16 weights, fp32 e_score_correction_bias): each float tensor is exactly
    source.to(bfloat16); the folder's logits are reported, not held to the source's (the bias was rounded)."""
    res, save = _save(tmp_path, "tiny:moonlight", "--save-dtype", "bf16")
    assert res.code == 0 and save["verdict"] == "pass", res.out[-3000:]
    assert save["checked"] == 2 * _tensors("tiny:moonlight")
    assert save["metrics"][PRETRAINED]["logits_max_abs_error"] >= 0.0


@pytest.mark.ranks
def test_a_writer_dropping_a_shard_is_named(tmp_path: Path) -> None:
    from convcheck.mutants.writer import DROPPED_SHARD

    res, save = _save(tmp_path, "tiny:qwen2-tied", "--hook", _HOOK + "drops_shard")
    assert res.code == 1 and save["verdict"] == "fail"
    held = sorted(n for n, e in open_checkpoint(build_fixture("tiny:qwen2-tied")).tensors.items()
                  if e.file == DROPPED_SHARD)  # fmt: skip
    found = _only(save)
    for label in (PRETRAINED, WEIGHTS):
        assert [f for f in save["findings"] if f["kind"] == "missing-shard" and label in f["message"]]
    assert {t for t, k in found if k == "missing"} == set(held)
    assert {k for _, k in found} == {"missing-shard", "missing", "shard-dropped", "total-size"}
    assert {t for t, k in found if k in ("missing-shard", "shard-dropped")} == {DROPPED_SHARD}
    missing = next(f for f in save["findings"] if f["kind"] == "missing")
    assert "the export stream yielded it: the writer dropped it" in missing["message"]
    assert "replay: convcheck verify --model tiny:qwen2-tied --oracle save --hook" in res.out


@pytest.mark.ranks
def test_a_tied_embedding_written_under_the_other_name_is_named(tmp_path: Path) -> None:
    res, save = _save(tmp_path, "tiny:qwen2-tied", "--tp", "2", "--hook", _HOOK + "tied_under_other_name")
    assert res.code == 1 and save["verdict"] == "fail"
    found = set(_only(save))
    assert found == {
        ("lm_head.weight", "not-in-index"),
        ("lm_head.weight", "extra"),
        ("model.embed_tokens.weight", "index-mismatch"),
        ("model.embed_tokens.weight", "missing"),
    }, found
    extra = next(f for f in save["findings"] if f["kind"] == "extra")
    assert extra["message"].startswith(PRETRAINED) and "stored in model-0000" in extra["message"]


@pytest.mark.ranks
def test_a_wrong_index_entry_is_named(tmp_path: Path) -> None:
    from convcheck.mutants.writer import MOVED

    res, save = _save(tmp_path, "tiny:qwen3", "--hook", _HOOK + "wrong_index_entry")
    assert res.code == 1 and save["verdict"] == "fail"
    assert set(_only(save)) == {(MOVED, "index-mismatch")}
    assert len(save["findings"]) == 2  # once per writer call
    assert all("says model-0000" in f["message"] for f in save["findings"])


@pytest.mark.local_spec("the expected findings of the local layout")
@pytest.mark.ranks
def test_a_writer_casting_fp32_tensors_is_named(tmp_path: Path) -> None:
    res, save = _save(tmp_path, "tiny:moonlight", "--hook", _HOOK + "casts_fp32")
    assert res.code == 1 and save["verdict"] == "fail"
    fp32 = sorted(n for n, e in open_checkpoint(build_fixture("tiny:moonlight")).tensors.items() if e.dtype == "F32")
    index = ("model.safetensors.index.json", "total-size")  # the writer counted the bytes before the cast
    assert fp32 and set(_only(save)) == {(n, "dtype") for n in fp32} | {index}
    first = next(f for f in save["findings"] if f["tensor"] == fp32[0])
    assert "dtype BF16, expected F32" in first["message"]


def _mtp_off(tmp_path: Path) -> Path:
    """tiny:deepseek-v3 with MTP switched off in config.json and its MTP layer's tensors moved into the shard of the
    final norm and the head: a source shard that holds tensors the provider does not build, and others it does."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "deepseek-v3-mtp-off"
    shutil.copytree(build_fixture("tiny:deepseek-v3"), folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_nextn_predict_layers"] = 0
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    into = index["weight_map"]["model.norm.weight"]
    merged = {**load_file(folder / into), **load_file(folder / "model-mtp.safetensors")}
    save_file(merged, str(folder / into), metadata={"format": "pt"})
    (folder / "model-mtp.safetensors").unlink()
    index["weight_map"] = {k: into if v == "model-mtp.safetensors" else v for k, v in index["weight_map"].items()}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return folder


@pytest.mark.ranks
def test_tensors_the_model_does_not_build_leave_their_shard_whole(tmp_path: Path) -> None:
    folder = _mtp_off(tmp_path)
    res, save = _save(tmp_path, str(folder))
    assert res.code == 0 and save["verdict"] == "pass", res.out[-3000:]
    built = [n for n in open_checkpoint(folder).tensors if not n.startswith("model.layers.4.")]
    assert save["checked"] == 2 * len(built)
    assert save["metrics"]["not_built"] == "44 source tensors of layers the model does not build (MTP off)"


@pytest.mark.ranks
def test_the_mtp_alias_bug_fails_the_writer(tmp_path: Path) -> None:
    """0.6.2 never exports layer 4's embed_tokens / shared_head.head (glm45-mtp-aliases-dropped, the same bridge
    code for DeepSeek-V3): the strict writer raises, and the MTP shard is missing from both folders."""
    res, save = _save(tmp_path, "tiny:deepseek-v3")
    assert res.code == 1 and save["verdict"] == "fail"
    raised = [f for f in save["findings"] if f["kind"] == "writer-raised"]
    assert len(raised) == 2 and all("44 tensors from the original checkpoint were not written" in f["message"]
                                    for f in raised)  # fmt: skip
    missing = {f["tensor"] for f in save["findings"] if f["kind"] == "missing"}
    assert "model.layers.4.embed_tokens.weight" in missing and "model.layers.4.eh_proj.weight" in missing
    never = next(f for f in save["findings"] if f["tensor"] == "model.layers.4.embed_tokens.weight")
    assert "the export stream never yielded it" in never["message"]
    assert {f["kind"] for f in save["findings"]} == {"writer-raised", "missing", "shard-dropped"}


def test_prove_written_names_a_flipped_element(tmp_path: Path) -> None:
    """The pure folder check alone: one bit flipped in a copy of a fixture shard is named with its first element."""
    import torch
    from safetensors.torch import load_file, save_file

    source = open_checkpoint(build_fixture("tiny:qwen3"))
    folder = tmp_path / "copy"
    shutil.copytree(source.path, folder)
    name = "model.layers.1.mlp.down_proj.weight"
    shard = folder / source.tensors[name].file
    tensors = load_file(shard)
    flipped = tensors[name].view(torch.int16).clone()
    flipped[3, 5] ^= 1
    tensors[name] = flipped.view(torch.bfloat16)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    report = prove_written(source, folder, label="copy")
    assert [(f.tensor, f.kind) for f in report.findings] == [(name, "bytes-differ")]
    assert "1/" in report.findings[0].message and "first at index [3, 5]" in report.findings[0].message
    assert report.checked == len(source.tensors)


def test_save_dtype_needs_the_save_oracle() -> None:
    res = run_cli("verify", "--model", "tiny:qwen3", "--save-dtype", "bf16")
    assert res.code == 2
    assert res.err.strip() == "convcheck: error: --save-dtype is an option of the save oracle; add --oracle save"


@pytest.mark.ranks
def test_a_writer_raising_on_rank_0_alone_is_named_without_a_hang(tmp_path: Path) -> None:
    """A source without tokenizer files: 0.6.2's save_hf_pretrained raises on rank 0 while writing the tokenizer,
    before the weights step the other ranks wait in; convcheck names it (rank 1 only stops), then save_hf_weights
    writes the whole folder."""
    folder = tmp_path / "no-tokenizer"
    shutil.copytree(build_fixture("tiny:nemotron-h"), folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    res, save = _save(tmp_path, str(folder), "--tp", "2")
    assert res.code == 1 and save["verdict"] == "fail"
    assert _only(save) == [
        ("<folder>", "no-weights"),
        ("<writer>", "writer-raised"),
        ("generation_config.json", "file-dropped"),
    ]
    raised = save["findings"][1]["message"]
    assert raised.startswith(f"{PRETRAINED} raised on rank 0: ValueError: Couldn't instantiate the backend tokenizer")
    assert save["checked"] == len(open_checkpoint(folder).tensors)  # the save_hf_weights folder, whole
    assert save["metrics"][DISTRIBUTED]["files"] == 4


def test_the_writer_calls_follow_what_the_bridge_offers() -> None:
    from convcheck.errors import BadInput
    from convcheck.oracles.save_write import plan

    now = frozenset({"distributed_save", "save_every_n_ranks", "weight_dtype"})
    assert [v.label for v in plan(1, None, now)] == [PRETRAINED, WEIGHTS]
    assert [(v.distributed, v.every_n) for v in plan(2, None, now)] == [(False, 1), (True, 1)]
    assert [(v.distributed, v.every_n) for v in plan(4, "bf16", now)] == [(False, 1), (True, 2)]
    assert all(v.cast == "bf16" for v in plan(4, "bf16", now))
    assert [v.label for v in plan(2, None, frozenset())] == [PRETRAINED, WEIGHTS]  # 0.3.x: no distributed_save
    with pytest.raises(BadInput, match="--save-dtype: this bridge's save_hf_weights takes no weight_dtype"):
        plan(1, "bf16", frozenset({"distributed_save"}))  # 0.4.x / 0.5.x


@pytest.mark.ranks
def test_a_strict_writer_raising_mid_stream_on_rank_0_alone_is_named_without_a_hang(tmp_path: Path) -> None:
    """The stream hands the writer a name the source has not: in save_hf_pretrained (rank 0 writes) only rank 0
    raises, mid-stream, while rank 1 is inside the export's gathers; with distributed_save both ranks raise."""
    res, save = _save(tmp_path, "tiny:qwen3", "--tp", "2", "--hook", _HOOK + "stream_renames_norm")
    assert res.code == 1 and save["verdict"] == "fail"
    assert sorted(_only(save)) == [("<folder>", "no-weights")] * 2 + [("<writer>", "writer-raised")] * 3
    raised = sorted(f["message"] for f in save["findings"] if f["kind"] == "writer-raised")
    assert [m.split(":")[0] for m in raised] == [f"{PRETRAINED} raised on rank 0", f"{DISTRIBUTED} raised on rank 0",
                                                 f"{DISTRIBUTED} raised on rank 1"]  # fmt: skip
    assert all("KeyError: \"Tensor 'model.norm.scale' from generator not found" in m for m in raised)


@pytest.mark.local_spec("the expected findings of the local layout")
@pytest.mark.ranks
def test_an_export_raising_on_every_rank_is_named_without_a_hang(tmp_path: Path) -> None:
    """Qwen3.5-MoE with SequentialMLP experts: 0.6.2's export raises on every rank (its MTP experts have no mapping
    there, the known import/export failure); each writer call names it per rank, and nothing waits for a barrier."""
    res, save = _save(tmp_path, "tiny:qwen3.5-moe", "--tp", "2", "--ep", "2")
    assert res.code == 1 and save["verdict"] == "fail"
    raised = sorted(f["message"].split(": ")[0] for f in save["findings"] if f["kind"] == "writer-raised")
    assert raised == [f"{PRETRAINED} raised on rank 0", f"{PRETRAINED} raised on rank 1",
                      f"{DISTRIBUTED} raised on rank 0", f"{DISTRIBUTED} raised on rank 1"]  # fmt: skip
    assert all("'NoneType' object has no attribute 'param_weight'" in f["message"]
               for f in save["findings"] if f["kind"] == "writer-raised")  # fmt: skip
    assert {f["kind"] for f in save["findings"]} == {"writer-raised", "missing", "shard-dropped", "no-weights"}


@pytest.mark.ranks
def test_a_written_config_that_changes_the_model_is_named_with_its_logits(tmp_path: Path) -> None:
    res, save = _save(tmp_path, "tiny:qwen3", "--hook", _HOOK + "config_eps_changed")
    assert res.code == 1 and save["verdict"] == "fail"
    assert _only(save) == [("<logits>", "logits-differ"), ("config.json:rms_norm_eps", "field-differs")]
    field, logits = save["findings"][1]["message"], save["findings"][0]["message"]
    assert field == f"{PRETRAINED}: rms_norm_eps is 0.01, the source's is 1e-06"
    assert logits.startswith(f"{PRETRAINED}: transformers' fp32 logits of the folder differ from the source's in ")
    assert "first at [0, 0, " in logits and save["metrics"][PRETRAINED]["logits_max_abs_error"] > 0
