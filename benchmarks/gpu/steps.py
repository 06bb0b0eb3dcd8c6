"""The step-check and step-replay units of the GPU check, one model each (``units.step_check`` and
``units.graph_vs_eager`` run them in a process of their own): a whole training step on the GPU against
the fp32 CPU path, and CUDA graph replay against eager replay over several steps."""
import math

import numpy as np

from .step_common import (CHECK_LR, CHECK_SCALES, GRAD_TOL, LOSS_TOL, REPLAY_LOSS_TOL,
                               REPLAY_SCALE, REPLAY_STATE_TOL, REPLAY_STEPS, compile_step_plan,
                               relative, relative_errors, release_device_memory, sgd, step_batches,
                               train_runner, worst)


# ---- step-check: fused AMP on the GPU vs fp32 on the CPU, from the same weights

def step_check_one(model, CpuExecutor, CudaExecutor, failures):
    """The first training step of ``model``: CudaExecutor (fused AMP plan) against CpuExecutor (fp32 unfused
    plan) from the same weights and batch. Loss within LOSS_TOL relative; gradients, parameter updates and BN
    running statistics within GRAD_TOL (per tensor, 2-norm of the difference relative to the tensor's norm,
    floored at NORM_FLOOR of the largest norm)."""
    print(f"  {model.label}: {model.about}")
    plan, reference_plan = compile_step_plan(model), compile_step_plan(model, fuse=False, amp=False)
    (x, y), = step_batches(model, 1)
    cpu = CpuExecutor(reference_plan, optimizer=sgd(), seed=0)
    start = cpu.state_dict()
    want_loss = cpu.train_step(x, y, CHECK_LR)
    want_grads, want_state = cpu.gradients(), cpu.state_dict()
    ex = None
    for scale in CHECK_SCALES:
        ex = CudaExecutor(plan, optimizer=sgd(), seed=0, replay="eager", init_loss_scale=scale)
        ex.load_state_dict(start)
        loss = ex.train_step(x, y, CHECK_LR)
        if not ex.skipped_last_step:
            break
        print(f"    loss scale 2^{math.log2(scale):.0f}: the scaled fp16 gradients overflowed and the step was "
              f"skipped (as GradScaler would); trying a lower start")
        ex = None
        release_device_memory()
    if ex is None:
        failures.append(f"step-check {model.name}: the first step overflowed at every loss scale {CHECK_SCALES}")
        return dict(model=model.name, ok=False, overflowed=True)
    grads, state = ex.gradients(), ex.state_dict()
    launches = len(train_runner(ex).tape)
    trainable = {p.name for p in plan.params if p.region == "params"}
    counters = {k for k in want_state if k.endswith("num_batches_tracked")}
    stats = set(want_state) - trainable - counters

    def updates(sd):
        return {k: np.asarray(sd[k], np.float64) - start[k] for k in trainable}
    checks = {"gradients": relative_errors(grads, want_grads), "updates": relative_errors(updates(state),
                                                                                           updates(want_state)),
              "BN stats": relative_errors({k: state[k] for k in stats}, {k: want_state[k] for k in stats})}
    loss_error = relative(loss, want_loss)
    ok_loss = loss_error <= LOSS_TOL
    print(f"    loss scale 2^{math.log2(scale):.0f}, {launches} kernel launches per step")
    print(f"    {'loss':10s} {loss:.6f} vs fp32 {want_loss:.6f}: relative {loss_error:.2e} (tol {LOSS_TOL:g})  "
          f"{'ok' if ok_loss else 'FAIL'}")
    result = dict(model=model.name, loss=loss, fp32_loss=want_loss, loss_error=loss_error, scale=scale,
                  launches=launches)
    ok = ok_loss
    if not ok_loss:
        failures.append(f"step-check {model.name}: loss {loss:.6f} vs fp32 {want_loss:.6f}")
    for label, errors in checks.items():
        top, name, median = worst(errors)
        good = top <= GRAD_TOL
        bad = sorted((k for k in errors if errors[k] > GRAD_TOL), key=lambda k: -errors[k])
        verdict = "ok" if good else "FAIL: " + ", ".join(bad[:4]) + (" ..." if len(bad) > 4 else "")
        print(f"    {label:10s} {len(errors):4d} tensors: worst {top:.2e} ({name}), median {median:.2e} "
              f"(tol {GRAD_TOL:g})  {verdict}")
        if not good:
            failures.append(f"step-check {model.name}: {label} off for {len(bad)} tensors, worst {name} {top:.2e}")
        ok = ok and good
        result[label] = dict(worst=top, worst_name=name, median=median, failing=bad)
    wrong = sorted(k for k in counters if not np.array_equal(state[k], want_state[k]))
    print(f"    {'counters':10s} {len(counters):4d} num_batches_tracked  "
          f"{'ok' if not wrong else 'FAIL: ' + str(wrong[:3])}")
    if wrong:
        failures.append(f"step-check {model.name}: num_batches_tracked differs for {wrong[:3]}")
    result["ok"] = ok and not wrong
    return result


# ---- step-replay: one captured graph per step equals the eager tape

def step_replay_one(model, CudaExecutor, failures):
    """Three executors from the same weights (graph replay, eager, eager again) take REPLAY_STEPS steps on the
    same batches. Graph vs eager: losses within REPLAY_LOSS_TOL relative (bitwise equal but for the order of
    fp32 atomics), state_dicts within REPLAY_STATE_TOL; eager vs eager shows how much the atomics alone make."""
    print(f"  {model.label}: {model.about}; {REPLAY_STEPS} steps, loss scale starts at 2^{math.log2(REPLAY_SCALE):.0f}")
    plan = compile_step_plan(model)
    modes = {"graph": "graph", "eager": "eager", "eager again": "eager"}
    executors = {label: CudaExecutor(plan, optimizer=sgd(), seed=0, replay=mode, init_loss_scale=REPLAY_SCALE)
                 for label, mode in modes.items()}
    start = executors["graph"].state_dict()
    for label in ("eager", "eager again"):
        executors[label].load_state_dict(start)
    losses, skipped, graphs = {k: [] for k in executors}, {k: 0 for k in executors}, []
    for x, y in step_batches(model, REPLAY_STEPS, seed=1):
        for label, ex in executors.items():
            losses[label].append(ex.train_step(x, y, CHECK_LR))
            skipped[label] += ex.skipped_last_step
        graphs.append(train_runner(executors["graph"]).graph)
    runner, eager_runner = train_runner(executors["graph"]), train_runner(executors["eager"])
    captured = runner.mode == "graph" and runner.graph is not None and all(g is runner.graph for g in graphs)
    states = {k: ex.state_dict() for k, ex in executors.items()}
    loss_diff = max(relative(a, b) for a, b in zip(losses["graph"], losses["eager"]))
    noise_diff = max(relative(a, b) for a, b in zip(losses["eager again"], losses["eager"]))
    state_diff, state_name, _ = worst(relative_errors(states["graph"], states["eager"]))
    noise_state, _, _ = worst(relative_errors(states["eager again"], states["eager"]))
    identical = losses["graph"] == losses["eager"] and all(np.array_equal(states["graph"][k], states["eager"][k])
                                                           for k in states["eager"])
    print(f"    graph captured: {'yes' if captured else 'NO'}; replay in use: {executors['graph'].replay_in_use}; "
          f"launches per step: "
          f"graph {'1 graph launch' if captured else 'NOT one'} ({len(runner.tape)} kernels inside), "
          f"eager {len(eager_runner.tape)} kernel launches")
    print(f"    losses  graph: {' '.join(f'{v:.6f}' for v in losses['graph'])}")
    print(f"            eager: {' '.join(f'{v:.6f}' for v in losses['eager'])}")
    print(f"    skipped steps (overflow): graph {skipped['graph']}, eager {skipped['eager']}, "
          f"eager again {skipped['eager again']}")
    ok_loss, ok_state = loss_diff <= REPLAY_LOSS_TOL, state_diff <= REPLAY_STATE_TOL
    ok_skips = skipped["graph"] == skipped["eager"]
    print(f"    graph vs eager: {'bit-identical' if identical else 'not bit-identical'}; losses max relative "
          f"{loss_diff:.1e} (tol {REPLAY_LOSS_TOL:g}) {'ok' if ok_loss else 'FAIL'}; state_dict worst {state_diff:.1e} "
          f"({state_name}; tol {REPLAY_STATE_TOL:g}) {'ok' if ok_state else 'FAIL'}")
    print(f"    eager vs eager again (fp32 atomics alone): losses {noise_diff:.1e}, state_dict worst {noise_state:.1e}")
    if not captured:
        failures.append(f"step-replay {model.name}: graph mode did not capture one graph reused every step "
                        f"(mode {runner.mode!r} {runner.reason})")
    if not ok_loss:
        failures.append(f"step-replay {model.name}: graph vs eager losses differ by {loss_diff:.1e} relative "
                        f"(eager vs eager: {noise_diff:.1e})")
    if not ok_state:
        failures.append(f"step-replay {model.name}: graph vs eager state_dict {state_name} differs by "
                        f"{state_diff:.1e} (eager vs eager: {noise_state:.1e})")
    if not ok_skips:
        failures.append(f"step-replay {model.name}: skipped steps differ: graph {skipped['graph']}, "
                        f"eager {skipped['eager']}")
    return dict(model=model.name, captured=captured, replay=executors["graph"].replay_in_use,
                launches_eager=len(eager_runner.tape), identical=identical,
                loss_diff=loss_diff, state_diff=state_diff, noise_loss_diff=noise_diff, noise_state_diff=noise_state,
                losses_graph=losses["graph"], losses_eager=losses["eager"], skipped=skipped,
                ok=captured and ok_loss and ok_state and ok_skips)
