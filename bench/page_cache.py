"""What a spool's ``pwrite`` costs in new page-cache pages beside recycled ones, on this machine.

A broker's spool grows into page-cache pages it has not used before (a fragment is up to 512
MiB); broker_bench's ceiling measures its ``pwrite`` by rewriting a truncated file, whose pages
the kernel recycles. On a VM whose free memory goes back to the host (free page reporting), a
page not used lately costs a host fault to fill, and the two differ by up to 10x: the large
append rows of broker_bench then measure the page cache as much as the broker. This prints
CPU microseconds per MiB written, in one run, for:

* ``new``: one file grown by ``--mib`` MiB, 1 MiB per ``pwrite`` (what a spool does);
* ``again``: the same right after (the kernel reuses the pages the first file freed);
* ``rewrite``: one file truncated every 64 MiB and rewritten (broker_bench's ``host_cost``);

and the ratio new / rewrite. Files go to ``--dir`` (default: the working directory, where the
benches put their brokers' spools). ``--drop-behind W`` adds a case of a file grown as a spool
that keeps only its last ``W`` MiB in the page cache: it starts the writeback of each ``W`` MiB
written (``sync_file_range``) and drops the ``W`` MiB before it (``POSIX_FADV_DONTNEED``), so
its pages are freed and taken again. It writes twice ``--mib`` and reports its second half (the
first takes the pages the cases before it freed). Only the writer's CPU is counted, not the
kernel's writeback threads.

    python bench/page_cache.py
    python bench/page_cache.py --mib 2048 --dir var
    python bench/page_cache.py --drop-behind 32
"""

from __future__ import annotations

import argparse
import ctypes
import os
import tempfile
import time

MiB = 1 << 20


def per_mib(directory: str, mib: int, rewrite_every: int = 0) -> float:
    """CPU seconds per MiB of ``mib`` 1 MiB ``pwrite`` calls into one temporary file."""
    payload = os.urandom(MiB)
    with tempfile.TemporaryFile(dir=directory) as f:
        fd = f.fileno()
        offset = 0
        start = time.process_time()
        for i in range(mib):
            if rewrite_every and i % rewrite_every == 0:
                os.ftruncate(fd, 0)
                offset = 0
            os.pwrite(fd, payload, offset)
            offset += MiB
        return (time.process_time() - start) / mib


def drop_behind_per_mib(directory: str, mib: int, window: int) -> float:
    """CPU seconds per MiB of the second half of ``2 * mib`` 1 MiB ``pwrite`` calls into one
    temporary file that keeps only its last ``window`` MiB cached (see the module docstring)."""
    libc = ctypes.CDLL(None, use_errno=True)
    sync_file_range = libc.sync_file_range
    sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
    write_start = 2  # SYNC_FILE_RANGE_WRITE: start writeback, do not wait for it
    payload = os.urandom(MiB)
    span = window * MiB
    with tempfile.TemporaryFile(dir=directory) as f:
        fd = f.fileno()
        start = 0.0
        for i in range(2 * mib):
            if i == mib:
                start = time.process_time()
            os.pwrite(fd, payload, i * MiB)
            end = (i + 1) * MiB
            if end % span == 0:
                if sync_file_range(fd, end - span, span, write_start) != 0:
                    raise OSError(ctypes.get_errno(), "sync_file_range")
                if end >= 2 * span:  # the window before: its writeback was started a window ago
                    os.posix_fadvise(fd, end - 2 * span, span, os.POSIX_FADV_DONTNEED)
        return (time.process_time() - start) / mib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1024, help="MiB written per case (default 1024)")
    ap.add_argument("--dir", default=".", help="directory of the temporary files (default: .)")
    ap.add_argument("--drop-behind", type=int, default=0, metavar="W",
                    help="add the drop-behind case, keeping W MiB cached (default: not run)")
    args = ap.parse_args()
    new = per_mib(args.dir, args.mib)
    again = per_mib(args.dir, args.mib)
    rewrite = per_mib(args.dir, args.mib, rewrite_every=64)
    print(f"pwrite of 1 MiB, CPU per MiB, {args.mib} MiB per case, in {os.path.abspath(args.dir)}")
    print(f"  new pages (a growing file)      {new * 1e6:8.0f} µs")
    print(f"  again (pages just freed)        {again * 1e6:8.0f} µs")
    print(f"  rewrite (broker_bench's ceiling){rewrite * 1e6:8.0f} µs")
    print(f"new / rewrite: {new / rewrite:.2f}x")
    if args.drop_behind:
        drop = drop_behind_per_mib(args.dir, args.mib, args.drop_behind)
        print(f"  drop-behind ({args.drop_behind} MiB cached)     {drop * 1e6:8.0f} µs  (new / drop-behind: "
              f"{new / drop:.2f}x)")


if __name__ == "__main__":
    main()
