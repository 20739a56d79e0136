"""One measurement in a child process of its own (zoo.py, hf_config_check.py): the child writes
its result as JSON to the path given after --out."""
import json
import os
import subprocess
import tempfile


def run_json_child(cmd, timeout, tail=3):
    """Runs `cmd` + ["--out", PATH] and returns the JSON it wrote to PATH. Raises RuntimeError
    with the last `tail` lines of its output when it fails or writes nothing, and
    subprocess.TimeoutExpired after `timeout` seconds."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as f:
        path = f.name
    try:
        p = subprocess.run(cmd + ["--out", path], capture_output=True, text=True,
                           timeout=timeout)
        with open(path) as f:
            text = f.read()
        if p.returncode != 0 or not text:
            lines = (p.stderr or p.stdout).strip().splitlines()[-tail:]
            raise RuntimeError(f"the child process exited {p.returncode}: {' | '.join(lines)}")
        return json.loads(text)
    finally:
        os.unlink(path)
