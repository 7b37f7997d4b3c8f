"""Module-level tasks for tests/test_workers.py (workers import tasks by name)."""
import os
import signal
import time


def add(a, b):
    return a + b


def environment(name):
    return os.environ.get(name)


def raise_value_error():
    raise ValueError("bad config\nsecond line")


def segfault():
    os.kill(os.getpid(), signal.SIGSEGV)


def hang():
    time.sleep(600)


def sticky_cuda_error():
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def pid():
    return os.getpid()
