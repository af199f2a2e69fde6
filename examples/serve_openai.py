"""Tutorial: serve a model and call it with the OpenAI client (docs/tutorials/serve.md).

    python examples/serve_openai.py runs/smollm2      # any language-model run directory

Starts `vaswani serve` on a free local port, waits until it has loaded the run, talks to it
with the `openai` package exactly as to OpenAI's service (a completion, a chat, a stream),
reads its Prometheus metrics, and stops it.
"""

import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from openai import OpenAI

run = Path(sys.argv[1] if len(sys.argv) > 1 else "runs/smollm2")
with socket.socket() as s:  # a free port on this machine
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = subprocess.Popen(["vaswani", "serve", str(run), "--port", str(port)])
base = f"http://127.0.0.1:{port}"
try:
    for _ in range(240):  # loading a 135M-parameter model takes a few seconds
        try:
            urllib.request.urlopen(f"{base}/health", timeout=1)
            break
        except OSError:
            if server.poll() is not None:
                sys.exit(f"vaswani serve exited with status {server.returncode}")
            time.sleep(0.5)

    client = OpenAI(base_url=f"{base}/v1", api_key="unused")  # no --api-key: any key works
    listed = client.models.list().data[0]
    model = listed.id  # the run's folder name
    print("model:", model)

    done = client.completions.create(model=model, prompt="The three primary colors are",
                                     max_tokens=12, temperature=0)
    print("completion:", repr(done.choices[0].text), done.usage)

    if getattr(listed, "chat", False):  # the checkpoint carries a chat template
        reply = client.chat.completions.create(
            model=model, max_tokens=20, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        print("chat:", reply.choices[0].message.content)

    print("stream:", end=" ")
    for chunk in client.completions.create(model=model, prompt="Once upon a time",
                                           max_tokens=16, temperature=0.8, seed=1, stream=True):
        print(chunk.choices[0].text, end="", flush=True)
    print()

    metrics = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
    print("metrics:", [line for line in metrics.splitlines()
                       if line.startswith("vaswani_requests_total")][:3])
finally:
    server.terminate()
    server.wait(timeout=30)
