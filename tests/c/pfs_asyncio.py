"""pfs_asyncio: Python asyncio tasks recorded through libpfs's task API
(pfs_task_t), the way docs/C-API.md ("Async tasks") says to, run by
tests/tests/c_abi.rs:

    python3 pfs_asyncio.py LIBPFS_SO PFS_H SHM_DIR SERVICE

Every coroutine is wrapped (Traced) so that each of its steps is entered
in its own task, which has its own statement; REQUESTS such tasks
interleave on the one event-loop thread (each records a stage, then three
waits separated by awaits), and one more is cancelled while it sleeps.
Prints {"ready":true,"segment":PATH,"requests":N} once they are done,
then waits for standard input to reach end of file.
"""

import asyncio
import collections.abc
import ctypes
import json
import os
import re
import sys

REQUESTS = 20

lib_path, header, shm_dir, service = sys.argv[1:5]
os.environ["PFS_SHM_DIR"] = shm_dir
os.environ["PFS_SERVICE_NAME"] = service
os.environ["PFS_CONSUMERS"] = "events_%_history_long=ON"

lib = ctypes.CDLL(lib_path)
text = open(header).read()


def define(name):
    return int(re.search(r"#define %s \(?(-?\d+)" % name, text).group(1))


P = ctypes.c_void_p
for fn, res, args in [
    ("pfs_init", ctypes.c_int32, []),
    ("pfs_statement_class_register", P, [ctypes.c_char_p]),
    ("pfs_stage_class_register", P, [ctypes.c_char_p]),
    ("pfs_wait_class_register", P, [ctypes.c_char_p]),
    ("pfs_stage_enter", None, [P]),
    ("pfs_wait_begin", None, [P, P, ctypes.c_uint32, ctypes.c_uint64]),
    ("pfs_wait_end", None, [P]),
    ("pfs_task_new", P, []),
    ("pfs_task_free", None, [P]),
    ("pfs_task_enter", ctypes.c_int32, [P]),
    ("pfs_task_exit", ctypes.c_int32, [P]),
    ("pfs_task_statement_begin", ctypes.c_int32, [P, P]),
    ("pfs_task_statement_set_text", None, [P, ctypes.c_char_p]),
    ("pfs_task_statement_mark_cancelled", None, [P]),
    ("pfs_task_statement_end", ctypes.c_int32, [P]),
    ("pfs_segment_path", ctypes.c_size_t, [ctypes.c_char_p, ctypes.c_size_t]),
]:
    f = getattr(lib, fn)
    f.restype = res
    f.argtypes = args

PFS_OK = define("PFS_OK")
WAIT_WORDS = define("PFS_WAIT_WORDS")
OP_LOCK = define("PFS_OP_LOCK")

assert lib.pfs_init() == PFS_OK, "pfs_init"
REQUEST = lib.pfs_statement_class_register(b"statement/pyasync/request")
WORK = lib.pfs_stage_class_register(b"stage/pyasync/work")
LOCK = lib.pfs_wait_class_register(b"wait/synch/mutex/pyasync/lock")


class Traced(collections.abc.Coroutine):
    """A coroutine whose every step runs entered in a task of its own,
    with one statement from its first step to its end."""

    def __init__(self, coro, sql_text):
        self.coro = coro
        self.text = sql_text
        self.task = lib.pfs_task_new()
        self.begun = False

    def _step(self, fn, *args):
        assert lib.pfs_task_enter(self.task) == PFS_OK
        done = False
        try:
            if not self.begun:
                self.begun = True
                assert lib.pfs_task_statement_begin(self.task, REQUEST) == PFS_OK
                lib.pfs_task_statement_set_text(self.task, self.text)
            try:
                return fn(*args)
            except StopIteration:
                done = True
                raise
            except asyncio.CancelledError:
                lib.pfs_task_statement_mark_cancelled(self.task)
                done = True
                raise
            finally:
                if done:
                    assert lib.pfs_task_statement_end(self.task) == PFS_OK
        finally:
            assert lib.pfs_task_exit(self.task) == PFS_OK
            if done:
                lib.pfs_task_free(self.task)
                self.task = None

    def send(self, value):
        return self._step(self.coro.send, value)

    def throw(self, *exc):
        return self._step(self.coro.throw, *exc)

    def close(self):
        if self.task is not None:
            self.coro.close()
            lib.pfs_task_free(self.task)  # an open statement: cancelled
            self.task = None

    def __await__(self):
        raise TypeError("run it as an asyncio Task")


async def request(i):
    lib.pfs_stage_enter(WORK)
    for k in range(3):
        w = (ctypes.c_uint64 * WAIT_WORDS)()
        lib.pfs_wait_begin(w, LOCK, OP_LOCK, i)
        lib.pfs_wait_end(w)
        await asyncio.sleep(0.001 * ((i + k) % 3))
    return i


async def forever():
    await asyncio.sleep(3600)


async def main():
    tasks = [asyncio.ensure_future(Traced(request(i), b"request %d" % i)) for i in range(REQUESTS)]
    stuck = asyncio.ensure_future(Traced(forever(), b"cancelled"))
    assert sorted(await asyncio.gather(*tasks)) == list(range(REQUESTS))
    stuck.cancel()
    try:
        await stuck
    except asyncio.CancelledError:
        pass


asyncio.run(main())
buf = ctypes.create_string_buffer(4096)
n = lib.pfs_segment_path(buf, len(buf))
print(json.dumps({"ready": True, "segment": buf.value.decode(), "requests": REQUESTS}), flush=True)
sys.stdin.read()
