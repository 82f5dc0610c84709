"""Starting the 2-process tests' children (`make test-multiprocess`): each on localhost, joined over one free port."""

import socket
import subprocess
import sys
from pathlib import Path


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_processes(script: Path, argv_of, logs_dir: Path, *, env: dict, timeout: float, n: int = 2) -> None:
  """Runs `python script *argv_of(i, port)` for processes i < n at once and waits for all; asserts each exited 0,
  showing the end of a failed one's log. Each child's output goes to a file (`logs_dir/<i>.log`): with pipes,
  waiting on one child while the other fills its pipe (gloo logs every connection) blocks that one, and the first
  then waits forever in a collective."""
  port = free_port()
  logs = [logs_dir / f"{i}.log" for i in range(n)]
  procs = []
  for i in range(n):
    with open(logs[i], "w") as f:
      argv = [sys.executable, str(script), *map(str, argv_of(i, port))]
      procs.append(subprocess.Popen(argv, env=env, stdout=f, stderr=subprocess.STDOUT))
  try:
    for p in procs:
      p.wait(timeout=timeout)
  finally:
    for p in procs:
      p.kill()
  for i, p in enumerate(procs):
    assert p.returncode == 0, f"process {i} failed:\n{logs[i].read_text()[-3000:]}"
