"""``python -m fedtail.data ensure NAME [--data-dir D] [--no-download]`` and ``info NAME``."""

from __future__ import annotations

import argparse
import sys

import torch

from fedtail.data.registry import DATASETS, ensure_dataset, load_dataset
from fedtail.errors import FedtailError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedtail.data", description="Locate, download or describe datasets."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    commands = (
        ("ensure", "find (or download) the files and print where they are"),
        ("info", "print sizes and classes"),
    )
    for cmd, text in commands:
        p = sub.add_parser(cmd, help=text)
        p.add_argument("name", help="one of: " + ", ".join(DATASETS))
        p.add_argument("--data-dir", default=None, help="folder searched first")
        p.add_argument("--no-download", action="store_true", help="never use the network")
    args = parser.parse_args(argv)
    try:
        if args.command == "ensure":
            path = ensure_dataset(args.name, args.data_dir, download=not args.no_download)
            print(path if path is not None else f"{args.name}: generated in memory, no files needed")
        else:
            ds = load_dataset(args.name, args.data_dir, download=not args.no_download)
            print(f"name:        {ds.name}")
            print(f"train/test:  {len(ds.train)} / {len(ds.test)}")
            print(f"input shape: {ds.input_shape} ({ds.train.x.dtype})")
            more = " ..." if ds.num_classes > 12 else ""
            print(f"classes:     {ds.num_classes}: {', '.join(ds.class_names[:12])}{more}")
            if ds.segmentation:
                from fedtail.data.segmentation import pixel_counts

                pixels = pixel_counts(ds.train.y, ds.num_classes)
                images = torch.as_tensor(ds.train.labels).bincount(minlength=ds.partition_classes)
                print(f"task:        segmentation, background class {ds.background}, masks {tuple(ds.train.y.shape[1:])}")
                print(f"train/class: pixels min {int(pixels.min())}, max {int(pixels.max())}; "
                      f"images by primary class min {int(images.min())}, max {int(images.max())}")
            else:
                counts = ds.train.y.bincount(minlength=ds.num_classes)
                print(f"train/class: min {int(counts.min())}, max {int(counts.max())}")
            if len(ds.mean) <= 3:
                print(f"mean/std:    {ds.mean} / {ds.std}")
    except FedtailError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
