"""A verifier module that is slow to import (tests the pool's resolve phase)."""

import time

time.sleep(1.5)


def verify(item, completion):
    return 1.0
