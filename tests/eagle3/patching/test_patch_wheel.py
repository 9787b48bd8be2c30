"""The patch's facts checked against the real sglang wheels (0.5.14 and 0.5.23) (§6.8 items 1 and 8): the
pristine hash against the wheel's RECORD, the hash table's consistency with the patch spec and
the helper sources, and static (AST, never imported) drift checks on the files the design
relies on but does not patch."""

from __future__ import annotations

import ast
import hashlib
import json
import zipfile

from patch_fixtures import PATCHED_SHA256, PRISTINE_SHA256, RELEASES, TARGET, wheel_file

from remote_agent.eagle3.patching import hashes, rehash
from remote_agent.eagle3.patching.blocks import apply_blocks, load_spec


def test_pristine_file_matches_pin_and_wheel_record(sglang_release):
    version, wheel = sglang_release
    pristine_sha, size, _ = RELEASES[version]
    data = wheel_file(wheel, TARGET)
    assert hashlib.sha256(data).hexdigest() == pristine_sha
    assert len(data) == size
    with zipfile.ZipFile(wheel) as zf:
        record = hashes.parse_record(zf.read(f"sglang-{version}.dist-info/RECORD").decode())
    assert record[TARGET] == pristine_sha
    assert (
        hashes.record_digest_to_hex("sha256=9h-TAZvx52gPRaH-InJEQz4bIgIcuVXlPSW5z5AEc_k")
        == PRISTINE_SHA256
    )


def test_table_entry_is_what_the_spec_produces(sglang_release):
    version, wheel = sglang_release
    pristine_sha, size, patched_sha = RELEASES[version]
    table = hashes.load_table()
    entry = table.entry(version)
    assert entry.pristine_sha256 == pristine_sha and entry.pristine_size == size
    assert entry.patched_sha256 == patched_sha and entry.wheel == wheel.name
    spec = load_spec(table.root / entry.patch)
    patched = apply_blocks(wheel_file(wheel, TARGET).decode(), spec).encode()
    assert hashlib.sha256(patched).hexdigest() == entry.patched_sha256
    # the reviewed diff shipped next to the spec is exactly what the spec produces
    diff = (table.root / rehash.diff_name(version)).read_text()
    assert diff == rehash.review_diff(wheel_file(wheel, TARGET), patched)
    assert all(line[0] != "-" for line in diff.splitlines()[2:] if line)  # additions only


def test_helper_sources_are_the_reviewed_ones():
    """Editing the hook or dense.py needs a review and `python -m ...patching.rehash`."""
    table = hashes.load_table()
    from remote_agent.eagle3.patching.patcher import helper_source_problems

    assert helper_source_problems(table) == []
    assert set(table.helper["files"]) == {
        "__init__.py",
        "hook.py",
        "compat.py",
        "dense.py",
        "stream_wire.py",
    }


def test_both_releases_side_by_side_and_nothing_else():
    assert hashes.load_table().versions() == sorted(RELEASES)


def test_drift_hashes_match_each_wheel(sglang_release):
    version, wheel = sglang_release
    drift = hashes.load_table().drift[version]
    assert set(drift) == set(rehash.drift_files(version))
    for rel, sha in drift.items():
        assert hashlib.sha256(wheel_file(wheel, rel)).hexdigest() == sha, rel


def test_drift_hashes_match_the_wheel(sglang_wheel):
    table = hashes.load_table()
    drift = table.drift["0.5.23"]
    # the reference notes pin these four; the table must agree with them
    assert drift["sglang/srt/models/kimi_k25.py"].startswith("77492faf")
    assert drift["sglang/srt/layers/logits_processor.py"].startswith("5154d547")
    assert drift["sglang/srt/model_executor/forward_batch_info.py"].startswith("9a7df5e3")
    assert drift["sglang/srt/layers/aux_hidden_states.py"].startswith("29d2f3c2")


def _tree(wheel, rel):
    return ast.parse(wheel_file(wheel, rel))


def _class(tree, name):
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _annotated_names(cls) -> set[str]:
    return {
        n.target.id
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def test_forward_batch_still_has_the_fields_the_hook_reads(sglang_release):
    _, sglang_wheel = sglang_release
    tree = _tree(sglang_wheel, "sglang/srt/model_executor/forward_batch_info.py")
    fields = _annotated_names(_class(tree, "ForwardBatch"))
    assert {
        "rids",
        "forward_mode",
        "input_ids",
        "extend_seq_lens_cpu",
        "extend_prefix_lens_cpu",
        "extend_seq_lens",
        "extend_prefix_lens",
    } <= fields
    methods = {n.name for n in _class(tree, "ForwardMode").body if isinstance(n, ast.FunctionDef)}
    assert {"is_extend", "is_target_verify", "is_mixed", "is_idle", "is_split_prefill"} <= methods


def test_server_flags_the_client_checks_still_exist(sglang_wheel):
    names: set[str] = set()
    with zipfile.ZipFile(sglang_wheel) as zf:
        for n in zf.namelist():
            if n.startswith("sglang/srt/arg_groups/fields/") and n.endswith(".py"):
                for cls in ast.walk(ast.parse(zf.read(n))):
                    if isinstance(cls, ast.ClassDef):
                        names |= _annotated_names(cls)
    assert {
        "enable_return_aux_hidden_states",
        "return_aux_hidden_state_layer_ids",
        "disable_radix_cache",
        "chunked_prefill_size",
        "disable_prefill_cuda_graph",
        "cuda_graph_backend_prefill",
        "enable_layernorm_sp",
        "enable_two_batch_overlap",
        "enable_mixed_chunk",
        "pp_size",
        "tp_size",
    } <= names
    http = wheel_file(sglang_wheel, "sglang/srt/entrypoints/http_server.py").decode()
    assert '@app.get("/server_info")' in http and '"/generate"' in http


def test_default_capture_layers_are_still_2_half_minus3(sglang_release):
    _, sglang_wheel = sglang_release
    tree = _tree(sglang_wheel, TARGET)
    fn = next(
        n
        for n in ast.walk(_class(tree, "DeepseekV2ForCausalLM"))
        if isinstance(n, ast.FunctionDef) and n.name == "set_eagle3_layers_to_capture"
    )
    lists = [ast.unparse(n) for n in ast.walk(fn) if isinstance(n, ast.List)]
    assert "[2, num_layers // 2, num_layers - 3]" in lists
    assert "[val + 1 for val in layer_ids]" in ast.unparse(fn)  # the +1 rule when ids[0] == 1


def test_writer_rank_names_still_exist(sglang_release):
    version, sglang_wheel = sglang_release
    src = wheel_file(sglang_wheel, "sglang/srt/runtime_context.py").decode()
    tree = ast.parse(src)
    assert any(isinstance(n, ast.FunctionDef) and n.name == "get_parallel" for n in tree.body)
    for name in ("attn_tp_rank", "attn_dp_rank", "attn_cp_rank", "attn_dp_size"):
        assert f'"{name}"' in src or f"{name}:" in src, name
    # 0.5.14 has no dp_rank (DP replicas): the hook reads it as 0, so on 0.5.14 two `--dp-size`
    # replicas would share a writer tag; sglang-launch never passes --dp-size (pinned here)
    has_dp_rank = '"dp_rank"' in src or "dp_rank:" in src
    assert has_dp_rank == (version != "0.5.14")


def test_table_is_plain_json_for_the_runbook_engine():
    table = json.loads((hashes.patches_dir() / hashes.TABLE_NAME).read_text())
    assert table["format"] == "eagle3-patch-hashes"
    (entry,) = [e for e in table["entries"] if e["sglang"] == "0.5.23" and e["path"] == TARGET]
    assert entry["pristine_sha256"] == PRISTINE_SHA256 and entry["patched_sha256"] == PATCHED_SHA256
