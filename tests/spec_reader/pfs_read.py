#!/usr/bin/env python3
"""Read a pfs-exporter segment from its specification alone.

    python3 tests/spec_reader/pfs_read.py SEGMENT_FILE

prints, as a JSON list, the rows of events_waits_summary_global_by_event_name
for that segment: one row per registered wait class, with event_name,
count_star, sum_timer_wait, min_timer_wait and max_timer_wait (picoseconds),
the live threads' rows plus the folded totals of the threads that exited.

Written from the format's specification only (the crate documentation of
shm-layout, shm-layout/src/lib.rs: the file diagram, the structure tables and
the protocols), with the Python standard library (mmap, struct, json), to
show that the document is enough to read a segment without our code. Every
constant below cites the table it comes from.

The read protocol, as the spec gives it:
  * header: magic, major 8 (or 7, 6), byte-order mark, header size, segment size no
    larger than the file, state 1 (ready); directory entries checked
    (4096-aligned, inside the segment, count x stride <= size); unknown
    section kinds ignored.
  * a sequence-locked row is accepted iff its seq, read before and after the
    row's fields, is the same even value; otherwise it is read again, a
    bounded number of times, then skipped and counted.
  * thread records are read only from ACTIVE pages, only when ALLOCATED,
    and kept only if the lock word is unchanged after the copy.
  * the global section (exited threads' totals) is read after the records,
    under its own seq; a copied record that the fold log shows as folded
    (same record index and lock-word version) is dropped, so nothing is
    counted twice. If more folds happened during the read than the fold log
    holds, the whole read starts again.

Python reads the mapping with plain loads (struct.unpack_from), not atomic
ones: the sequence checks reject a torn row like any other concurrent write.
Exit status 0; rows skipped after retries are reported on stderr.
"""

import json
import mmap
import struct
import sys
import time

# Header (layout::Header, 4096 bytes), field offsets.
MAGIC = b"PFSSHM\0\0"
H_MAGIC, H_MAJOR, H_MINOR, H_BYTE_ORDER, H_HEADER_SIZE = 0x000, 0x008, 0x00C, 0x010, 0x014
H_SEGMENT_SIZE, H_STATE, H_SECTION_COUNT = 0x018, 0x020, 0x02C
H_HISTORY_LEN, H_SERVICE_LEN, H_SERVICE = 0x054, 0x058, 0x060
H_SECTIONS = 0x100
HEADER_SIZE = 4096
# Header table, `major`: 8; an 8.x reader also reads 7.x and 6.x segments.
# They differ in the summary row's histogram (its buckets' scale, its
# pending bucket), which this reader does not read, so all are read alike.
# (5.x differs in memory rows, which it does not read either, but is not
# needed here.)
MAJORS = (6, 7, 8)
BYTE_ORDER = 0x01020304
STATE_READY = 1
MAX_SECTIONS = 16

# Section directory entry (layout::SectionEntry, 32 bytes).
SECTION_ENTRY = 32
SEC_CLASSES, SEC_GLOBAL, SEC_THREADS = 2, 4, 5

# Class entry (layout::ClassEntry, 128 bytes).
CLASS_STRIDE = 128
CLASS_READY = 2
CLASS_NAME_MAX = 112
# Class kinds (the spec's class kind table): 1..=7 are the wait kinds.
WAIT_KINDS = range(1, 8)

# Global section: GlobalHeader (6208 bytes), then max_classes summary rows.
G_SEQ, G_FOLD_COUNT, G_FOLD_LOG = 0, 8, 64
FOLD_LOG_LEN, FOLD_ENTRY = 256, 24
G_ROWS = 6208

# Summary row (layout::SummaryRow, 384 bytes). Since 5.0 a thread's row is
# guarded by entry c of the record's row sequence array (8 bytes each, right
# after the thread header); a global row by the global section's seq.
ROW_SIZE = 384
SEQ_SIZE = 8
R_COUNT, R_TIMED, R_SUM_LO, R_SUM_HI, R_MIN, R_MAX = 8, 16, 24, 32, 40, 48
NO_MIN = 2**64 - 1

# Container header (layout::ContainerHeader, 64 bytes); page directory after it.
C_RECORDS_PER_PAGE, C_MAX_PAGES, C_RECORD_SIZE, C_PAGE_SIZE = 0, 4, 8, 16
C_PAGES_OFFSET, C_PAGES_ADDED = 24, 32
CONTAINER_HEADER = 64
PAGE_ACTIVE = 1
LOCK_ALLOCATED = 2

# Thread record: a head, ThreadHeader (896 bytes) and max_classes row
# sequence locks (8 bytes each, padded to a multiple of 64), and a body, three
# history rings of history_len rows (128, 128 and 384 bytes) then max_classes
# summary rows. A page holds its records' heads side by side, then their
# bodies.
T_LOCK, T_TOUCHED = 0, 128
THREAD_HEADER = 896
HISTORY_ROW_BYTES = 128 + 128 + 384

RETRIES = 1000


class SpecError(Exception):
    """The file is not a segment this reader accepts (and why)."""


def u32(buf, off):
    return struct.unpack_from("<I", buf, off)[0]


def u64(buf, off):
    return struct.unpack_from("<Q", buf, off)[0]


class Segment:
    """A mapped segment, its header and directory validated."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
        mm = self.mm
        if len(mm) < HEADER_SIZE:
            raise SpecError("shorter than a header")
        if mm[H_MAGIC:H_MAGIC + 8] != MAGIC:
            raise SpecError("bad magic")
        if u32(mm, H_BYTE_ORDER) != BYTE_ORDER:
            raise SpecError("byte order is not little-endian")
        if u32(mm, H_MAJOR) not in MAJORS:
            raise SpecError("unknown major version %d" % u32(mm, H_MAJOR))
        if u32(mm, H_HEADER_SIZE) != HEADER_SIZE:
            raise SpecError("header size is not 4096")
        self.size = u64(mm, H_SEGMENT_SIZE)
        if self.size > len(mm):
            raise SpecError("segment_size exceeds the file")
        if u64(mm, H_STATE) != STATE_READY:
            raise SpecError("segment is not ready")
        self.history_len = u32(mm, H_HISTORY_LEN)
        n = min(u32(mm, H_SERVICE_LEN), 64)
        self.service = bytes(mm[H_SERVICE:H_SERVICE + n]).decode("utf-8", "replace")
        self.sections = {}
        count = u32(mm, H_SECTION_COUNT)
        if count > MAX_SECTIONS:
            raise SpecError("section_count > 16")
        for i in range(count):
            e = H_SECTIONS + i * SECTION_ENTRY
            kind, off, size = u32(mm, e), u64(mm, e + 8), u64(mm, e + 16)
            cnt, stride = u32(mm, e + 24), u32(mm, e + 28)
            if kind == 0:
                continue
            if off % 4096 or off + size > self.size or cnt * stride > size:
                raise SpecError("section %d (kind %d) is out of bounds" % (i, kind))
            self.sections[kind] = (off, size, cnt, stride)
        for k in (SEC_CLASSES, SEC_GLOBAL, SEC_THREADS):
            if k not in self.sections:
                raise SpecError("no section of kind %d" % k)
        self.max_classes = self.sections[SEC_CLASSES][2]
        self.skipped = 0

    # -- classes ------------------------------------------------------------

    def classes(self):
        """{index: (kind, name)} of the ready classes."""
        off, _, count, stride = self.sections[SEC_CLASSES]
        out = {}
        for c in range(count):
            e = off + c * stride
            if u32(self.mm, e) != CLASS_READY:
                continue
            kind, n = u32(self.mm, e + 8), u32(self.mm, e + 12)
            if n > CLASS_NAME_MAX:
                continue
            out[c] = (kind, bytes(self.mm[e + 16:e + 16 + n]).decode("utf-8", "replace"))
        return out

    # -- sequence-locked reads ------------------------------------------------

    def row(self, off, seq):
        """(count, timed count, sum, min, max) of the summary row at `off`,
        read under the sequence lock at `seq`; None if it never read
        consistently."""
        mm = self.mm
        for _ in range(RETRIES):
            s1 = u64(mm, seq)
            if s1 & 1:
                continue
            r = self.fields(off)
            if u64(mm, seq) == s1:
                return r
        self.skipped += 1
        return None

    def fields(self, off):
        """(count, timed count, sum, min, max) at summary row `off`."""
        mm = self.mm
        return (
            u64(mm, off + R_COUNT),
            u64(mm, off + R_TIMED),
            u64(mm, off + R_SUM_LO) | (u64(mm, off + R_SUM_HI) << 64),
            u64(mm, off + R_MIN),
            u64(mm, off + R_MAX),
        )

    def fold_count(self):
        return u64(self.mm, self.sections[SEC_GLOBAL][0] + G_FOLD_COUNT)

    def global_totals(self, wanted):
        """(fold_count, folded {(record, version)}, {class: row}) of the
        global section, read under its seq."""
        mm = self.mm
        base = self.sections[SEC_GLOBAL][0]
        for _ in range(RETRIES):
            s1 = u64(mm, base + G_SEQ)
            if s1 & 1:
                time.sleep(0.0001)
                continue
            folds = u64(mm, base + G_FOLD_COUNT)
            folded = set()
            for i in range(FOLD_LOG_LEN):
                e = base + G_FOLD_LOG + i * FOLD_ENTRY
                ticket = u64(mm, e)
                if ticket != 0 and ticket <= folds and ticket + FOLD_LOG_LEN > folds:
                    folded.add((u64(mm, e + 8), u64(mm, e + 16)))
            rows = {c: self.fields(base + G_ROWS + c * ROW_SIZE) for c in wanted}
            if u64(mm, base + G_SEQ) == s1:
                return folds, folded, rows
        raise SpecError("the global section never read consistently")

    # -- thread records ---------------------------------------------------------

    def records(self, wanted):
        """[(record index, version, {class: row})] of the ALLOCATED records of
        ACTIVE pages, each kept only if its lock word did not change."""
        mm = self.mm
        sec, size = self.sections[SEC_THREADS][:2]
        per_page = u32(mm, sec + C_RECORDS_PER_PAGE)
        max_pages = u32(mm, sec + C_MAX_PAGES)
        rec_size = u64(mm, sec + C_RECORD_SIZE)
        page_size = u64(mm, sec + C_PAGE_SIZE)
        pages = sec + u64(mm, sec + C_PAGES_OFFSET)
        added = min(u64(mm, sec + C_PAGES_ADDED), max_pages)
        head_size = THREAD_HEADER + (self.max_classes * SEQ_SIZE + 63) // 64 * 64
        summaries = self.history_len * HISTORY_ROW_BYTES
        body_size = summaries + self.max_classes * ROW_SIZE
        if head_size + body_size != rec_size or per_page * rec_size > page_size:
            raise SpecError("thread record geometry does not add up")
        out = []
        for p in range(added):
            if u64(mm, sec + CONTAINER_HEADER + 8 * p) & 3 != PAGE_ACTIVE:
                continue
            page = pages + p * page_size
            if page + page_size > sec + size:
                raise SpecError("page %d is outside the Threads section" % p)
            for i in range(per_page):
                rec = page + i * head_size
                body = page + per_page * head_size + i * body_size
                lock = u64(mm, rec + T_LOCK)
                if lock & 3 != LOCK_ALLOCATED:
                    continue
                touched = [u64(mm, rec + T_TOUCHED + 8 * w) for w in range(16)]
                rows = {}
                for c in wanted:
                    if touched[c // 64] >> (c % 64) & 1:
                        r = self.row(body + summaries + c * ROW_SIZE,
                                     rec + THREAD_HEADER + c * SEQ_SIZE)
                        if r is not None:
                            rows[c] = r
                if u64(mm, rec + T_LOCK) == lock:
                    out.append((p * per_page + i, lock >> 2, rows))
        return out

    # -- the table ----------------------------------------------------------------

    def waits_summary_global(self):
        classes = self.classes()
        waits = sorted(c for c, (kind, _) in classes.items() if kind in WAIT_KINDS)
        for _ in range(RETRIES):
            before = self.fold_count()
            live = self.records(waits)
            folds, folded, totals = self.global_totals(waits)
            if folds - before < FOLD_LOG_LEN:
                break
        else:
            raise SpecError("threads kept exiting faster than the fold log holds")
        acc = {c: [0, 0, NO_MIN, 0] for c in waits}

        def add(c, row):
            count, timed, total, lo, hi = row
            a = acc[c]
            a[0] += count
            a[1] += total
            if timed:  # MIN and MAX are over timed events only
                a[2] = min(a[2], lo)
                a[3] = max(a[3], hi)

        for c in waits:
            add(c, totals[c])
        for record, version, rows in live:
            if (record, version) in folded:
                continue  # already in the global totals
            for c, row in rows.items():
                add(c, row)
        out = []
        for c in waits:
            count, total, lo, hi = acc[c]
            out.append({
                "event_name": classes[c][1],
                "count_star": count,
                "sum_timer_wait": total,
                "min_timer_wait": 0 if lo == NO_MIN else lo,
                "max_timer_wait": hi,
            })
        return out


def main(argv):
    if len(argv) != 2:
        print("usage: pfs_read.py SEGMENT_FILE", file=sys.stderr)
        return 2
    try:
        seg = Segment(argv[1])
        rows = seg.waits_summary_global()
    except (OSError, SpecError) as e:
        print("pfs_read.py: %s: %s" % (argv[1], e), file=sys.stderr)
        return 1
    if seg.skipped:
        print("pfs_read.py: %d rows skipped after %d retries" % (seg.skipped, RETRIES),
              file=sys.stderr)
    json.dump(rows, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
