"""A PyTorch training loop fed by dpuio: DataLoader workers read samples through the
agent, a sleep stands in for the accelerator's compute, and each epoch prints samples/s
and accelerator utilisation (the share of wall time the "accelerator" was busy, i.e.
not waiting for data).

    # an agent, and some samples in its container
    target/release/dpu-agent serve --data-dir /tmp/dpuio-train --listen 127.0.0.1:7300 &
    python examples/python/train.py --make 512 --epochs 2 --workers 2 --compute-ms 20

``--make N`` writes N .npy samples (``--sample-kib`` each) under ``--path`` first,
through dpuio. The model is a small linear layer so the loop is real PyTorch; its
compute is the sleep. Checkpoints go to ``--checkpoint`` every epoch (see
checkpoint.py for saving and loading on their own).
"""

import argparse
import io
import time

import numpy as np
import torch

import dpuio
import dpuio.torch


def make_samples(client, path, n, sample_kib, seed=0):
    client.mkdir(path, parents=True)
    rng = np.random.default_rng(seed)
    floats = sample_kib * 1024 // 4
    for i in range(n):
        x = rng.standard_normal(floats, dtype=np.float32)
        buf = io.BytesIO()
        np.save(buf, x)
        client.write_bytes(f"{path}/sample_{i:06d}.npy", buf.getbuffer())
    print(f"wrote {n} samples of {sample_kib} KiB under {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agent", help="agent address (default $DPUIO_AGENT, else 127.0.0.1:7300)")
    p.add_argument("--path", default="/datasets/train", help="dataset directory in the container")
    p.add_argument("--make", type=int, default=0, metavar="N", help="first write N samples under --path")
    p.add_argument("--sample-kib", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--compute-ms", type=float, default=20.0, help="sleep per step, standing in for compute")
    p.add_argument("--checkpoint", default="/checkpoints/train", help="checkpoint prefix ('' for none)")
    args = p.parse_args()

    client = dpuio.Client(args.agent)
    if args.make:
        make_samples(client, args.path, args.make, args.sample_kib)

    dataset = dpuio.torch.Dataset(args.path, transform_fn=dpuio.torch.tensor_npy, client=client)
    if len(dataset) == 0:
        raise SystemExit(f"no samples under {args.path}: use --make N")
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch, shuffle=True, num_workers=args.workers, drop_last=True,
        persistent_workers=args.workers > 0,
    )
    features = dataset[0].numel()
    model = torch.nn.Linear(features, 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = dpuio.torch.Checkpoint(args.checkpoint, client=client) if args.checkpoint else None
    print(f"{len(dataset)} samples of {features * 4 // 1024} KiB, batch {args.batch}, "
          f"{args.workers} workers, {args.compute_ms} ms compute per step")

    for epoch in range(args.epochs):
        samples = 0
        busy = 0.0
        start = time.perf_counter()
        for x in loader:
            t = time.perf_counter()
            loss = model(x).pow(2).mean()  # a real (tiny) step ...
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(args.compute_ms / 1000)  # ... and the accelerator's time
            busy += time.perf_counter() - t
            samples += x.shape[0]
        wall = time.perf_counter() - start
        print(f"epoch {epoch}: {samples / wall:8.1f} samples/s, {samples * features * 4 / wall / 2**20:7.1f} MiB/s, "
              f"accelerator utilisation {100 * busy / wall:5.1f}%")
        if ckpt is not None:
            with ckpt.writer(f"epoch-{epoch}.pt") as w:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, w)
    if ckpt is not None:
        print(f"checkpoints in {args.checkpoint}: {ckpt.names()}")
    client.close()


if __name__ == "__main__":
    main()
