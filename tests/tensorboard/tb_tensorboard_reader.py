#!/usr/bin/env python3
"""Read an event file written by kiln's tensorboard plugin with TensorBoard's own reader.

Usage: tb_tensorboard_reader.py <tb_sample_writer> <plugin_dir>

Skips (exit 77, CTest SKIP_RETURN_CODE) when the `tensorboard` Python
package is absent (Debian: python3-tensorboard, when available). Otherwise it
runs tb_sample_writer into a temporary run directory, which prints every
scalar it logged ("scalar <step> <tag> <value>") and the event folder
("dir <path>"), and checks what TensorBoard sees in that folder through three
of its layers:
  1. LegacyEventFileLoader (TFRecord framing and CRCs, then event_pb2.Event):
     the first event has file_version "brain.Event:2", then the scalar
     events in order with their steps, tags and float32 simple_values, and
     non-decreasing wall times. The loader stops silently at a bad or
     truncated record, so the exact count is what proves every CRC.
  2. EventAccumulator (what the scalar dashboard's legacy path uses):
     Scalars(tag) gives every (step, value) logged under that tag.
  3. EventFileLoader (the data_compat migration TensorBoard's data provider
     reads): each simple_value becomes a scalar tensor of the same value.
Exit 0 when all hold, 1 with a message otherwise.
"""
import os
import struct
import subprocess
import sys
import tempfile

SKIP = 77

try:
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util
except ImportError as exc:  # the module (or a part it needs) is not installed
    print(f"SKIP: TensorBoard's Python reader is not available ({exc}); "
          "install python3-tensorboard to run this check")
    sys.exit(SKIP)


def f32(x):
    """The value rounded to float32, as simple_value stores it."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def fail(msg):
    print(f"FAIL: {msg}")
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    writer, plugin_dir = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory(prefix="kiln-tb-reader-") as run_dir:
        out = subprocess.run([writer, plugin_dir, run_dir], capture_output=True, text=True)
        if out.returncode != 0:
            fail(f"tb_sample_writer exited {out.returncode}: {out.stderr.strip()}")
        # Expected events: consecutive scalar lines of one step form one event.
        expected, tb_dir = [], None
        for line in out.stdout.splitlines():
            parts = line.split()
            if parts[0] == "scalar":
                step, tag, value = int(parts[1]), parts[2], float(parts[3])
                expected.append((step, tag, f32(value)))
            elif parts[0] == "dir":
                tb_dir = parts[1]
        if not expected or not tb_dir:
            fail(f"tb_sample_writer printed nothing usable:\n{out.stdout}")
        files = sorted(f for f in os.listdir(tb_dir) if "tfevents" in f)
        if len(files) != 1:
            fail(f"expected one event file in {tb_dir}, found {files}")
        path = os.path.join(tb_dir, files[0])

        # 1. Raw events.
        events = list(event_file_loader.LegacyEventFileLoader(path).Load())
        if not events or events[0].file_version != "brain.Event:2":
            fail(f"first event is not file_version brain.Event:2: {events[:1]}")
        got = []
        last_wall = 0.0
        for ev in events:
            if ev.wall_time < last_wall:
                fail(f"wall_time went back: {ev.wall_time} < {last_wall}")
            last_wall = ev.wall_time
            for v in ev.summary.value:
                if v.WhichOneof("value") != "simple_value":
                    fail(f"value {v.tag} is not a simple_value")
                got.append((ev.step, v.tag, v.simple_value))
        if got != expected:
            fail(f"raw events differ:\n got      {got}\n expected {expected}")

        # 2. EventAccumulator scalars, per tag.
        acc = event_accumulator.EventAccumulator(tb_dir, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        tags = sorted(acc.Tags()[event_accumulator.SCALARS])
        want_tags = sorted({t for _, t, _ in expected})
        if tags != want_tags:
            fail(f"scalar tags {tags}, expected {want_tags}")
        for tag in tags:
            series = [(s.step, s.value) for s in acc.Scalars(tag)]
            want = [(s, v) for s, t, v in expected if t == tag]
            if series != want:
                fail(f"EventAccumulator.Scalars({tag!r}) = {series}, expected {want}")

        # 3. Migrated (tensor) form.
        migrated = []
        for ev in event_file_loader.EventFileLoader(path).Load():
            for v in ev.summary.value:
                arr = tensor_util.make_ndarray(v.tensor)
                migrated.append((ev.step, v.tag, f32(float(arr))))
        if migrated != expected:
            fail(f"migrated events differ:\n got      {migrated}\n expected {expected}")

        print(f"OK: TensorBoard read {len(events)} events ({len(expected)} scalars, "
              f"{len(tags)} tags) from {files[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
