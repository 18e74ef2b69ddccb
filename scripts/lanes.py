#!/usr/bin/env python3
"""Run the test binaries cargo built in N lanes at once, longest first.

Reads cargo's JSON messages (`cargo test --no-run --message-format=json ...`) on stdin and runs
every test executable in it, each with the arguments given after `--`. Why lanes: most of a test
binary's time is spent waiting (a broker electing a leader, a process being killed and restarted,
a timeout running out), so two binaries at once finish the suite in well under the time of one
after the other on the same two cores.

Invariants:
- Every binary runs exactly once; the run fails (exit 1) when any binary fails or cannot start.
- Binaries that use the shared Redis, RabbitMQ and NATS servers (`SHARED`) never run at the same
  time as each other: they create queues, streams and keys on one server, and were written to run
  one binary after another.
- A binary's output is printed whole when it ends, never interleaved with another's, so the
  "test result:" lines the summary counts stay intact.
- The order is longest first by the times in scripts/test-times.tsv (a binary missing there is
  taken as long, so a new heavy test does not start last); the times of this run are written to
  target/test-times.tsv, to copy over the committed file when the suite's shape changes.
"""

import json
import os
import subprocess
import sys
import threading
import time

SHARED = {
    "dlq_copy_writable", "dlq_copy_writable_2", "dlq_sinks", "dlq_sinks_rabbitmq_http",
    "http_sink", "nats", "rabbitmq", "redis_sink", "sink_secrets",
}
UNKNOWN_SECONDS = 120.0


def executables(stream):
    seen = []
    for line in stream:
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        kind = msg["target"]["kind"][0]
        name = msg["target"]["name"]
        label = name if kind == "test" else f"{name} ({kind})"
        seen.append((label, name, msg["executable"]))
    return seen


def load_times(path):
    times = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) == 2:
                    times[parts[1]] = float(parts[0])
    except FileNotFoundError:
        pass
    return times


def main():
    args = sys.argv[1:]
    if "--" in args:
        args = args[args.index("--") + 1:]
    lanes = int(os.environ.get("OUTBOXD_TEST_LANES", "2"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    times = load_times(os.path.join(root, "scripts", "test-times.tsv"))
    todo = executables(sys.stdin)
    if not todo:
        print("lanes: cargo listed no test executables", file=sys.stderr)
        return 1
    todo.sort(key=lambda t: times.get(t[0], UNKNOWN_SECONDS), reverse=True)

    lock = threading.Condition()
    shared_busy = [False]
    failed = []
    took = {}
    env = dict(os.environ, CARGO_MANIFEST_DIR=root)

    def take():
        # Called with the lock held: the longest binary this lane may start now, or None to wait.
        for i, (label, name, exe) in enumerate(todo):
            if name in SHARED and shared_busy[0]:
                continue
            return todo.pop(i)
        return None

    def lane():
        while True:
            with lock:
                job = None
                while todo:
                    job = take()
                    if job is not None:
                        break
                    lock.wait()
                if job is None:
                    return
                label, name, exe = job
                shared = name in SHARED
                if shared:
                    shared_busy[0] = True
            start = time.monotonic()
            try:
                proc = subprocess.run([exe] + args, cwd=root, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT)
                out, rc = proc.stdout.decode("utf-8", "replace"), proc.returncode
            except OSError as e:
                out, rc = f"lanes: could not start {exe}: {e}\n", 127
            seconds = time.monotonic() - start
            with lock:
                took[label] = seconds
                if shared:
                    shared_busy[0] = False
                if rc != 0:
                    failed.append(label)
                sys.stdout.write(f"\n     Running {label} ({exe}), {seconds:.1f}s, exit {rc}\n{out}")
                sys.stdout.flush()
                lock.notify_all()

    threads = [threading.Thread(target=lane) for _ in range(max(1, lanes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    os.makedirs(os.path.join(root, "target"), exist_ok=True)
    with open(os.path.join(root, "target", "test-times.tsv"), "w") as f:
        for label, seconds in sorted(took.items(), key=lambda kv: -kv[1]):
            f.write(f"{seconds:.1f}\t{label}\n")
    if failed:
        print(f"\nlanes: failed: {', '.join(sorted(failed))}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
