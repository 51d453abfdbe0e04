#!/usr/bin/env python3
"""The run's time budget: watch a training run of grpo_homework.py and send it SIGTERM (the homework's own stop:
"stopping after this step", then a checkpoint) as soon as one more step after the one in flight would leave too
little time to score after. run.sh then resumes the run with --max-steps at the steps done, which goes straight to
the final evaluation.

    python3 watchdog.py --pid PID --run RUN_DIR --log LOG --deadline EPOCH_SECONDS

It signals only while training (after metrics.jsonl appears, before "Training completed!": the homework treats a
signal outside training as an abort) and only once (a second signal aborts without a checkpoint). Its estimates, each from the run itself:
  a step     the longest step after the first so far x 1.15 (the first alone while it is the only one;
             STEP_PRIOR_S before any), as the wall time between metrics.jsonl lines;
  scoring    the evaluation before training, from its log lines, x EVAL_FACTOR + 10 s;
and from priors (seconds, environment): CKPT_S (checkpoint at the stop; 1.78 B weights + fp32 moments = 17.8 GB),
RESUME_S (the resumed process's start and loading), SAVE_S (final/, plots, records), MARGIN_S.
STOP_AFTER=N (tests): stop after step N whatever the time.
"""
import argparse
import json
import os
import signal
import time
from pathlib import Path

ENV = lambda name, default: float(os.environ.get(name, default))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:                                # a zombie (exited, not yet reaped) is not alive; no /proc: os.kill decides
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:           # no /proc, or the process was reaped between the two looks
        return not Path("/proc/self").exists()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--deadline", type=float, required=True)
    args = parser.parse_args()
    ckpt, resume, save, margin = (ENV("CKPT_S", 30), ENV("RESUME_S", 45), ENV("SAVE_S", 20), ENV("MARGIN_S", 15))
    step_prior, eval_factor, stop_after = ENV("STEP_PRIOR_S", 30), ENV("EVAL_FACTOR", 1.3), int(ENV("STOP_AFTER", 0))
    t0 = time.time()
    say = lambda text: print(f"[watchdog {time.time() - t0:.0f}s] {text}", flush=True)
    eval_start = eval_end = train_start = None
    lines, signalled = [], False
    say(f"deadline in {args.deadline - t0:.0f} s; priors: checkpoint {ckpt:.0f} s, resume {resume:.0f} s, "
        f"save {save:.0f} s, margin {margin:.0f} s, a step {step_prior:.0f} s until measured")
    while alive(args.pid):
        now = time.time()
        text = args.log.read_text(errors="replace") if args.log.exists() else ""
        if eval_start is None and "Evaluating the starting model" in text:
            eval_start = now
        if eval_end is None and "Accuracy before training" in text:
            eval_end = now
            say(f"evaluation before training took {eval_end - (eval_start or t0):.0f} s")
        metrics = args.run / "metrics.jsonl"
        if train_start is None and metrics.exists():
            train_start = now
        if "Training completed!" in text and not signalled:     # scoring after: a signal now would abort it
            signalled = True
            say("training ended by itself (--max-steps, or the data's end): nothing to stop")
        if train_start is not None and not signalled:
            rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
            fresh = len(rows) > len(lines)
            lines += [now] * (len(rows) - len(lines))
            marks = [train_start] + lines
            took = [b - a for a, b in zip(marks, marks[1:])]
            step = 1.15 * (max(took[1:]) if len(took) > 1 else took[0] if took else step_prior)
            scoring = eval_factor * ((eval_end or now) - (eval_start or t0)) + 10
            reserve = ckpt + resume + scoring + save + margin
            left_after_next = args.deadline - (marks[-1] + 2 * step)
            stop = left_after_next < reserve or (stop_after and len(rows) >= stop_after - 1)
            if fresh or stop:
                say(f"{len(rows)} steps done" + (f" (the last {took[-1]:.0f} s)" if took else "") +
                    f"; a step ~{step:.0f} s; after the next one {left_after_next:.0f} s would be left, the "
                    f"scoring after needs {reserve:.0f} s: " + ("STOP after the step in flight" if stop else "go on"))
            if stop:
                os.kill(args.pid, signal.SIGTERM)
                signalled = True
        time.sleep(0.5)
    say("the run's process ended")


if __name__ == "__main__":
    main()
