"""Steps split by each engine's own markers (with the counts they carry), the engine recognised, the engine
phases mapped onto batchscope's idle causes, and, without markers, steps and mode inferred and said so."""
from __future__ import annotations

from batchscope.telemetry.importers import import_trace
from kineto_builder import KinetoTrace

CB = "transformers/generation/continuous_batching/"


def imported(tr: KinetoTrace, tmp_path, **write) -> dict:
    return import_trace(tr.write(tmp_path / "t.pt.trace.json.gz", **write))


def test_vllm_steps_carry_their_token_counts_and_keep_work_launched_after_the_annotation(tmp_path):
    tr = KinetoTrace()
    tr.annotation("execute_context_1(16)_generation_2(2)", 0, 50)
    tr.launch(5, 2, kernel_at=10, kernel_dur=30)
    tr.launch(60, 2, kernel_at=62, kernel_dur=5, name="sample_kernel")      # sampling runs after execute_model
    tr.annotation("execute_context_0(0)_generation_3(3)", 100, 40)
    tr.launch(105, 2, kernel_at=110, kernel_dur=20)
    tr.gpu_annotation("execute_context_0(0)_generation_3(3)", 110, 25)
    tr.kernel("no_launch_in_file", 131, 4, corr=None)                     # inside the device-side twin
    tl = imported(tr, tmp_path)
    s0, s1 = tl["steps"]
    assert tl["meta"]["source"]["engine"] == "vllm"
    assert (s0["prefill_tokens"], s0["decode_tokens"], s0["num_requests"]) == (16, 2, 3)
    assert (s1["prefill_tokens"], s1["decode_tokens"], s1["num_requests"]) == (0, 3, 3)
    assert s0["compute_us"] == [10, 67]                  # the sampling kernel belongs to its step
    assert s1["compute_us"] == [110, 135]                # the twin brings in the op with no launch
    assert s0["marker"].startswith("execute_context_1")
    assert tl["meta"]["source"]["steps_from"] == "vLLM's execute_* step annotations"


def test_older_and_detailed_vllm_names_parse(tmp_path):
    tr = KinetoTrace()
    tr.annotation("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785sqsq32sqsk32785)", 0, 50)
    tr.launch(5, 2, kernel_at=10, kernel_dur=30)
    tr.annotation("execute_new_2_cached_30", 100, 40)
    tr.launch(105, 2, kernel_at=110, kernel_dur=20)
    s0, s1 = imported(tr, tmp_path)["steps"]
    assert (s0["prefill_tokens"], s0["decode_tokens"], s0["num_requests"]) == (0, 32, 32)
    assert (s1["num_requests"], s1["prefill_tokens"]) == (32, 0)


def test_sglang_steps_and_its_engine(tmp_path):
    tr = KinetoTrace()
    tr.annotation("step[EXTEND bs=2 toks=64]", 0, 50)
    tr.launch(5, 2, kernel_at=10, kernel_dur=30)
    tr.annotation("step[DECODE bs=2]", 100, 40)
    tr.graph(105, 10, kernels=[(118, 5), (124, 5)])
    tl = imported(tr, tmp_path)
    s0, s1 = tl["steps"]
    assert tl["meta"]["source"]["engine"] == "sglang"
    assert (s0["prefill_tokens"], s0["decode_tokens"], s0["num_requests"]) == (64, 0, 2)
    assert (s1["prefill_tokens"], s1["decode_tokens"], s1["num_requests"]) == (0, 2, 2)
    assert s1["compute_us"] == [118, 129]


def transformers_loop(tr: KinetoTrace, t0: float, kernel_us: float = 40) -> None:
    """One turn of transformers' continuous-batching loop as with_stack records it on the loop's thread:
    prepare_next_batch [t0, t0+20] (schedule_batch [t0+2, t0+8], prepare_batch_tensors [t0+10, t0+18]),
    _generation_step [t0+20, t0+70] launching one kernel at t0+22 and blocking in retrieve_device_outputs
    (cudaStreamSynchronize [t0+30, t0+25+kernel_us]), update_batch [t0+70, t0+90]."""
    tr.python(CB + "continuous_api.py(945): _generation_loop_body", t0, 95)
    tr.python(CB + "continuous_api.py(381): prepare_next_batch", t0, 20)
    tr.python(CB + "scheduler.py(341): schedule_batch", t0 + 2, 6)
    tr.python(CB + "input_outputs.py(319): prepare_batch_tensors", t0 + 10, 8)
    tr.python(CB + "continuous_api.py(550): _generation_step", t0 + 20, 50)
    tr.launch(t0 + 22, 3, kernel_at=t0 + 25, kernel_dur=kernel_us)
    tr.python(CB + "input_outputs.py(470): retrieve_device_outputs", t0 + 28, 40)
    tr.sync(t0 + 30, kernel_us - 5)
    tr.python(CB + "continuous_api.py(640): update_batch", t0 + 70, 20)


def test_transformers_loop_turns_are_steps_and_its_functions_are_phases(tmp_path):
    tr = KinetoTrace()
    for k in range(3):
        transformers_loop(tr, 100 * k)
    tl = imported(tr, tmp_path)
    assert tl["meta"]["source"]["engine"] == "transformers"
    steps = tl["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert [s["compute_us"] for s in steps] == [[25, 65], [125, 165], [225, 265]]
    # gap [65,125]: blocked in cudaStreamSynchronize [65,65]... it ended at 65 with the kernel: nothing left;
    # retrieve_device_outputs [65,68] (wait), _generation_step [68,70] (launch), update_batch [70,90],
    # the loop body alone [90,95] (a step marker: nothing recorded), nothing [95,100], prepare_next_batch [100,102]
    # and [108,110] and [118,120] (schedule), schedule_batch [102,108], prepare_batch_tensors [110,118] (fill),
    # _generation_step [120,122] (launch), then the launch call [122,125]
    assert steps[1]["idle_by_cause_us"] == {"wait": 3.0, "launch": 7.0, "update": 20.0, "host_other": 10.0,
                                            "schedule": 12.0, "fill": 8.0}
    assert steps[1]["gpu_idle_before_us"] == 60.0
    assert tl["meta"]["source"]["inferred"] == ["mode"]
    assert {s["mode"] for s in steps} == {"sync"}



def test_a_cpu_only_transformers_trace_is_timed_on_its_host_and_idle_turns_are_no_steps(tmp_path):
    """transformers on a CPU (5.2x: compute_batch inside _generation_step): no device, so each step's compute is
    its compute_batch range and its phases are its loop functions; a turn that only waited is not a step."""
    tr = KinetoTrace()
    tr.python(CB + "continuous_api.py(1081): _generation_loop_body", 0, 50)        # waiting for requests
    tr.python(CB + "continuous_api.py(482): prepare_next_batch", 0, 5)
    for k in range(3):
        t0 = 100 + 100 * k
        tr.python(CB + "continuous_api.py(1081): _generation_loop_body", t0, 95)
        tr.python(CB + "continuous_api.py(482): prepare_next_batch", t0, 20)
        tr.python(CB + "scheduler.py(341): schedule_batch", t0 + 2, 6)
        tr.python(CB + "input_outputs.py(333): prepare_batch_tensors", t0 + 10, 8)
        tr.python(CB + "continuous_api.py(1156): _generation_step", t0 + 20, 50)
        tr.python(CB + "continuous_api.py(635): _generation_step", t0 + 21, 48)
        tr.python(CB + "model_runner.py(126): compute_batch", t0 + 25, 40)
        tr.cpu_op("aten::mm", t0 + 30, 30)
        tr.python(CB + "input_outputs.py(319): retrieve_device_outputs", t0 + 66, 2)
        tr.python(CB + "continuous_api.py(538): update_batch", t0 + 70, 20)
    tl = imported(tr, tmp_path)
    src = tl["meta"]["source"]
    assert src["engine"] == "transformers" and tl["meta"]["device"] == "cpu"
    steps = tl["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2]
    assert any("1 turn(s) of transformers' loop ran no forward" in n for n in src["notes"])
    s1 = steps[1]
    assert s1["compute_us"] == [225, 265] and s1["compute_basis"] == "host"
    assert s1["cpu"] == {"schedule": [200, 210], "fill": [210, 218], "launch": [225, 265], "wait": [266, 268],
                         "update": [270, 290]}
    assert s1["gpu_idle_before_us"] == 60.0             # the previous compute_batch ended at 165
    assert tl["summary"]["busy_basis"] == "host" and tl["summary"]["busy_pct"] > 0

def test_numbered_annotations_give_steps_their_numbers(tmp_path):
    tr = KinetoTrace()
    tr.annotation("step_7", 0, 50)
    tr.launch(5, 2, kernel_at=10, kernel_dur=30)
    tr.annotation("step_8", 100, 40)
    tr.launch(105, 2, kernel_at=110, kernel_dur=20)
    assert [s["step"] for s in imported(tr, tmp_path)["steps"]] == [7, 8]


def blocking_loop(tr: KinetoTrace, steps: int, period_us: float = 200) -> None:
    """An unmarked serving loop: per step, host work [t, t+60], a forward of 3 kernels (calls at t+60..t+64),
    an `.item()` sync in the middle of it, and the final sync on the outputs: 2 blocking calls per step."""
    for k in range(steps):
        t = k * period_us
        tr.cpu_op("aten::index_put_", t, 55)
        tr.launch(t + 60, 2, kernel_at=t + 70, kernel_dur=20)
        tr.sync(t + 63, 28)                               # .item(): waits for the first kernel
        tr.launch(t + 92, 2, kernel_at=t + 96, kernel_dur=30)
        tr.launch(t + 95, 2, kernel_at=t + 127, kernel_dur=30)
        tr.sync(t + 98, 60)                               # the outputs


def test_without_markers_steps_are_inferred_from_the_hosts_blocking_rhythm(tmp_path):
    tr = KinetoTrace()
    blocking_loop(tr, 6)
    tl = imported(tr, tmp_path)
    src = tl["meta"]["source"]
    assert src["engine"] == "unknown"
    assert "steps" in src["inferred"] and "blocking calls" in src["steps_from"] and "2 per step" in src["steps_from"]
    steps = tl["steps"]
    assert [s["compute_us"] for s in steps] == [[200 * k + 70, 200 * k + 157] for k in range(6)]
    assert all(s["gpu_idle_before_us"] == 113.0 for s in steps[1:])
    # the gap: the final sync ends at 158 (wait 1), the thread is idle [158,200] then in aten::index_put_
    # [200,255], idle [255,260], then the launch [260,270]
    assert steps[1]["idle_by_cause_us"] == {"wait": 1.0, "host_other": 47.0, "host_op": 55.0, "launch": 10.0}


def test_without_blocking_calls_graph_launches_split_the_steps(tmp_path):
    tr = KinetoTrace()
    for k in range(4):
        t = 100 * k
        tr.cpu_op("aten::copy_", t, 30)
        tr.graph(t + 35, 10, kernels=[(t + 50, 20), (t + 71, 20)])
    tl = imported(tr, tmp_path)
    assert "graph launches" in tl["meta"]["source"]["steps_from"]
    assert [s["compute_us"] for s in tl["steps"]] == [[100 * k + 50, 100 * k + 91] for k in range(4)]


def test_a_device_only_trace_splits_at_its_long_idle_gaps(tmp_path):
    tr = KinetoTrace()
    for k in range(4):
        for j in range(5):
            tr.kernel("k", 1000 * k + 12 * j, 10, corr=None)
    tl = imported(tr, tmp_path)
    assert "device timeline" in tl["meta"]["source"]["steps_from"]
    assert [s["compute_us"] for s in tl["steps"]] == [[1000 * k, 1000 * k + 58] for k in range(4)]
    assert tl["steps"][1]["idle_by_cause_us"] == {"unattributed": 942.0}


def test_a_loop_that_launches_ahead_of_the_device_is_inferred_async(tmp_path):
    tr = KinetoTrace()
    for k in range(5):
        t = 100 * k
        tr.annotation(f"ProfilerStep#{k + 1}", t, 100)
        tr.launch(t + 5, 2, kernel_at=max(t + 10, 100 * k + 30), kernel_dur=95)   # queued behind the last one
    tl = imported(tr, tmp_path)
    assert {s["mode"] for s in tl["steps"]} == {"async"}
    assert "mode" in tl["meta"]["source"]["inferred"]


def test_atom_steps_carry_their_counts_and_name_the_engine(tmp_path):
    tr = KinetoTrace()
    tr.annotation("prefill[bs=3 tok=900 ctx=0]", 0, 50)
    tr.launch(5, 2, kernel_at=10, kernel_dur=30)
    tr.annotation("decode[bs=16/32 tok=16]", 100, 40)
    tr.launch(105, 2, kernel_at=110, kernel_dur=20)
    tl = imported(tr, tmp_path)
    s0, s1 = tl["steps"]
    assert tl["meta"]["source"]["engine"] == "atom"
    assert (s0["prefill_tokens"], s0["decode_tokens"], s0["num_requests"]) == (900, 0, 3)
    assert (s1["prefill_tokens"], s1["decode_tokens"], s1["num_requests"]) == (0, 16, 16)
