import os
import signal
import threading

import numpy as np
import pytest

from hvd_train.training.stopping import StopRequests


def test_a_signal_while_training_becomes_a_flag_and_a_second_one_interrupts():
    requests = StopRequests()
    before = signal.getsignal(signal.SIGTERM)
    assert np.array_equal(requests.flags(), [0, 0, 0, 0])
    with requests.catching_signals():
        os.kill(os.getpid(), signal.SIGTERM)
        assert requests.signal == signal.SIGTERM
        assert np.array_equal(requests.flags(), [1, 0, 0, 0])
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before  # the handlers are given back


def test_a_failed_write_is_the_second_flag():
    requests = StopRequests()
    requests.failure = "cannot write checkpoints: disk full"
    assert np.array_equal(requests.flags(), [0, 1, 0, 0])


def test_outside_the_main_thread_signals_keep_their_handlers():
    requests, seen = StopRequests(), []

    def train():
        with requests.catching_signals():
            seen.append(signal.getsignal(signal.SIGTERM))

    before = signal.getsignal(signal.SIGTERM)
    worker = threading.Thread(target=train)
    worker.start()
    worker.join()
    assert seen == [before]
