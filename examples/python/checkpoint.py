"""Save and load a PyTorch checkpoint through dpuio.

    target/release/dpu-agent serve --data-dir /tmp/dpuio-ckpt --listen 127.0.0.1:7300 &
    python examples/python/checkpoint.py --mib 256

``Checkpoint(prefix).writer(name)`` is a file object for ``torch.save``: bytes go into
registered chunks, at most ``chunks_in_flight`` of them being written at once, and the
checkpoint appears under its name only once it is complete and durable (an exception
inside the ``with`` block leaves nothing behind). ``reader(name)`` is a seekable file
object for ``torch.load`` that reads chunks in parallel.
"""

import argparse
import time

import torch

import dpuio
import dpuio.torch


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", help="agent address (default $DPUIO_AGENT, else 127.0.0.1:7300)")
    p.add_argument("--prefix", default="/checkpoints/example")
    p.add_argument("--mib", type=int, default=64, help="size of the model's weights")
    p.add_argument("--chunk-mib", type=int, default=8)
    p.add_argument("--in-flight", type=int, default=4, help="chunks being written or read at once")
    args = p.parse_args()

    client = dpuio.Client(args.agent)
    ckpt = dpuio.torch.Checkpoint(args.prefix, client=client, chunk_bytes=args.chunk_mib << 20,
                                  chunks_in_flight=args.in_flight)
    width = 1024
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(max(1, args.mib // 4))])
    state = {"model": model.state_dict(), "step": 1000}
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())

    t = time.perf_counter()
    with ckpt.writer("step-1000.pt") as w:
        torch.save(state, w)
    saved = time.perf_counter() - t
    print(f"saved {nbytes / 2**20:.0f} MiB in {saved:.2f} s ({nbytes / saved / 2**20:.0f} MiB/s)")

    # A save that fails half-way publishes nothing.
    try:
        with ckpt.writer("step-2000.pt") as w:
            w.write(b"half a checkpoint")
            raise RuntimeError("the job died while saving")
    except RuntimeError:
        pass
    print(f"checkpoints: {ckpt.names()} (the interrupted step-2000.pt is not there)")

    t = time.perf_counter()
    with ckpt.reader("step-1000.pt") as r:
        loaded = torch.load(r)
    took = time.perf_counter() - t
    print(f"loaded in {took:.2f} s ({nbytes / took / 2**20:.0f} MiB/s), {r.chunks_read} chunks read")
    model.load_state_dict(loaded["model"])
    same = all(torch.equal(a, b) for a, b in zip(state["model"].values(), loaded["model"].values()))
    print(f"step {loaded['step']}, weights identical: {same}")
    client.close()


if __name__ == "__main__":
    main()
