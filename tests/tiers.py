"""The suite's tiers, in one place (tests/conftest.py marks the items from here):

- `attack`: every test of tests/faults and every test that counts trials in the tally (the
  multibox attacks). `pytest -m attack` runs the attack suite alone.
- `slow`: the tests whose measured duration (the xdist full run's `--durations`, recorded in
  docs/ARCHITECTURE.md "Test tiers") is long enough that the edit loop skips them:
  `make test-fast` runs `-m "not slow"`; `make test` and CI run everything.

A prefix names a file (or a folder, or a test with its parameters left open); a new slow test
is added here, not marked in its file, so the tiers stay readable in one list.
"""

from __future__ import annotations

from typing import Any

# Every test that starts a real sshd or network namespaces (markers `sshd`, `netns`) is slow;
# so are these nodeid prefixes: tmux end-to-end runs, multi-process training, whole pipelines.
# The first part by what each test starts, the second by measured duration; move a test in
# or out by its measured `--durations` (make test prints the 25 slowest).
SLOW: tuple[str, ...] = (
    "tests/e2e/",
    "tests/multibox/",
    "tests/ssh/test_tui_tmux_ssh.py",
    "tests/tui/test_tmux_e2e.py",
    "tests/tui/test_tmux_picker.py",
    "tests/tui/test_locked_second_cockpit.py",
    "tests/tui/test_reattach.py",
    "tests/tui/test_reattach_follow.py",
    "tests/faults/test_cockpit_intent.py",
    "tests/faults/test_exactly_once.py",
    "tests/faults/test_job_lifecycle.py",
    "tests/faults/test_eagle3_service_restart.py",
    "tests/faults/test_long_context.py",
    "tests/faults/test_fanout.py",
    "tests/agent/test_reattach.py",
    "tests/eagle3/drafter/test_bench_long_context.py",
    "tests/eagle3/test_bench_fp8_aux.py::test_the_bench_runs_end_to_end_at_tiny_sizes",
    "tests/eagle3/drafter/test_drafter_train.py",
    "tests/eagle3/drafter/test_drafter_seq_parallel.py",
    "tests/eagle3/drafter/test_drafter_seq_parallel_train.py",
    "tests/eagle3/drafter/test_drafter_long_samples.py",
    "tests/eagle3/drafter/test_drafter_eval.py",
    "tests/eagle3/drafter/test_metrics_breakdown.py",
    "tests/eagle3/drafter/test_drafter_skip_rows.py",
    "tests/eagle3/drafter/test_drafter_data.py",
    "tests/eagle3/extraction/test_reference_extract.py",
    "tests/eagle3/extraction/test_gpu_scripts_cpu.py",
    "tests/eagle3/extraction/test_canary_sglang.py",
    # measured: over 30 s each in the xdist full run of 2026-12-04 (2 workers, load 15-20)
    "tests/faults/test_lock.py",
    "tests/faults/test_spool_full.py",
    "tests/faults/test_eagle3_identity.py",
    "tests/faults/test_prefill_graph_resolution.py",
    "tests/faults/test_secrets.py::test_box_job_log_is_redacted_local",
    "tests/faults/test_audit.py::test_box_head_deleted_is_refused",
    "tests/eagle3/drafter/test_drafter_attention.py::test_compiled_merge_matches_eager",
    "tests/eagle3/drafter/test_drafter_long_memory.py::test_compiled_",
    "tests/eagle3/drafter/test_drafter_shards.py::test_compiled_",
    "tests/eagle3/drafter/test_drafter_long_memory.py::test_shared_cast_gradients_reach_ddp",
    "tests/eagle3/drafter/test_drafter_long_memory.py::test_recomputing_soft_ce_matches",
    "tests/eagle3/drafter/test_drafter_context.py::test_a_short_drafter_fails_in_real_sglang",
    "tests/eagle3/extraction/test_extract_client.py::test_end_to_end_matches_the_reference",
    # measured 2026-12-07 alone at load ~10: ~60 s (an extraction, then the bench's 2 trainers)
    "tests/eagle3/online/test_bench_online_sglang.py::test_bench_online_against_a_server",
    # measured alone on 2026-12-07 (load 7-9): 55-65 s per /bin/sh, 30 s
    "tests/faults/test_records_terminal.py::test_records_and_terminals_cannot_be_forged",
    "tests/tui/test_operator_night.py::test_interrupting_auto_mid_job",
    # measured 2026-12-07 in `make test-fast` (2 workers, quiet): 5 s or more each; together
    # ~430 of the fast tier's ~830 worker-seconds
    "tests/eagle3/online/test_online_faults.py",
    "tests/eagle3/online/test_online_ddp.py",
    "tests/eagle3/online/test_stream_hook.py::test_both_modes_route_the_stream",
    "tests/eagle3/online/test_stream_hook.py::test_slow_consumer_never_blocks",
    "tests/eagle3/online/test_stream_hook.py::test_stream_carries_rows_ids",
    "tests/eagle3/online/test_online_train.py::test_online_equals_offline_bit_for_bit",
    "tests/eagle3/online/test_online_train.py::test_disk_cache_feeds_the_second_epoch",
    "tests/eagle3/online/test_online_train.py::test_a_producer_of_another_model_is_refused",
    "tests/eagle3/online/test_online_train.py::test_a_producer_that_reforwards_differently",
    "tests/eagle3/serving/test_drive_runbook.py",
    "tests/faults/test_values_sweep.py::test_no_value_runs_as_code",
    "tests/faults/test_delete_attacks.py::test_kill9_mid_delete_then_resume",
    "tests/faults/test_delete_attacks.py::test_delete_on_a_full_disk_frees_it",
    "tests/faults/test_delete_attacks.py::test_two_drivers_delete_once",
    "tests/faults/test_secrets.py::test_a_secret_given_as_a_value_is_refused",
    "tests/faults/test_atomic_write.py::test_kill_between_write_and_rename",
    "tests/faults/test_audit.py::test_audit_verify_consults_the_box_head",
    "tests/faults/test_audit.py::test_enospc_on_state_dir",
    "tests/eagle3/extraction/test_extract_client.py::test_full_disk_refused_then_failing",
    "tests/eagle3/extraction/test_extract_client.py::test_partial_run_then_resume",
    "tests/eagle3/serving/test_serving_checks.py::test_accept_of_exactly_one_fails",
    "tests/eagle3/serving/test_serving_checks.py::test_accept_uses_sglangs_formula",
    "tests/eagle3/serving/test_gpu_sglang_check.py::test_kimi_gpu_preset_has_kimis_mla_dims",
    "tests/eagle3/drafter/test_eval_simulate.py",
    "tests/eagle3/drafter/test_drafter_long_memory.py::test_fused_soft_ce_matches_the_direct",
    "tests/eagle3/drafter/test_drafter_long_memory.py::test_trainer_step_with_compile_loss",
    "tests/tui/test_operator_night.py::test_a_silent_job_says_how_long",
    "tests/tui/test_full_log_search.py::test_search_the_full_log",
    "tests/ssh/test_connect_phases.py::test_auto_names_the_phase_and_its_bound",
    # and 3.5 s or more in the next measurement (fast tier at 184.6 s, over its 3 minutes)
    "tests/tui/test_quit_and_runs.py::test_quit_with_a_bound_step_asks",
    "tests/tui/test_operator_night.py::test_terminal_footer_help_ctrl_c",
    "tests/eagle3/online/test_fetcher.py::test_a_turn_the_loader_reaches_first",
    "tests/tui/test_unreachable_host.py::test_port_that_never_speaks_ssh",
    "tests/tui/test_run_all_intent.py::test_relaunch_continues_run_all",
    "tests/faults/test_long_line.py::test_one_giant_line_streams",
    "tests/eagle3/serving/test_gpu_sglang_check.py::test_diag_launch_relaunches",
    "tests/tui/test_literal_strings.py::test_fuzzed_strings_render_literally",
    "tests/faults/test_eagle3_http.py::test_three_transports_share_the_client",
    "tests/faults/test_eagle3_http.py::test_trickled_reply_times_out",
    "tests/eagle3/data/test_kimi_template.py::test_tokenize_command_reports_refused",
    "tests/runbook/test_loader_fuzz.py::test_tags_and_alias_chains",
    "tests/agent/test_protocol.py::test_agent_answers_every_fuzzed_line",
    "tests/agent/test_protocol.py::test_parser_never_raises_anything_else",
)
SLOW_ENVIRONMENTS = ("sshd", "netns")


def attack_item(item: Any) -> bool:
    return item.nodeid.startswith("tests/faults/") or "tally" in getattr(item, "fixturenames", ())


def slow_item(item: Any) -> bool:
    return item.nodeid.startswith(SLOW) or any(m in item.keywords for m in SLOW_ENVIRONMENTS)
