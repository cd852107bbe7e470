"""The in-flight record of a worker: written before a sample's media are read, cleared after,
readable from another process after the writer died, and turned into the loader's error."""

from __future__ import annotations

import os
import pickle
import signal
from types import SimpleNamespace

import pytest
from megatron.energon.source_info import SourceInfo

from energon_pack.runtime.inflight import InflightRecorder, WorkerDiedError, naming_dead_workers, read_inflight, worker_death_error


def _sample(key: str = "sample00017", shard: str = "shards/train-000001.tar") -> SimpleNamespace:
    source = SourceInfo(dataset_path="/data/ds", index=17, shard_name=shard, file_names=(f"{key}.json", f"{key}.0.jpg"))
    return SimpleNamespace(__key__=key, __sources__=[source])


def test_a_record_names_the_sample_while_it_is_decoded_and_is_cleared_after(tmp_path):
    recorder = InflightRecorder(str(tmp_path))
    with recorder.decoding(_sample(), "postencode"):
        record = read_inflight(str(tmp_path), os.getpid())
    assert record == {
        "dataset": "/data/ds", "shard": "shards/train-000001.tar", "key": "sample00017",
        "members": ["sample00017.0.jpg"], "stage": "postencode", "pid": os.getpid(),
    }
    assert read_inflight(str(tmp_path), os.getpid()) is None
    with pytest.raises(ValueError), recorder.decoding(_sample(), "preencode"):
        raise ValueError("a decoder error")
    assert read_inflight(str(tmp_path), os.getpid()) is None


def test_without_a_folder_nothing_is_recorded(tmp_path):
    with InflightRecorder(None).decoding(_sample(), "preencode"):
        pass
    assert read_inflight(str(tmp_path), os.getpid()) is None


def test_the_record_of_a_process_killed_while_decoding_survives_it(tmp_path):
    recorder = InflightRecorder(str(tmp_path))
    pid = os.fork()
    if pid == 0:  # the child: record, then die as a native crash would
        with recorder.decoding(_sample("sample00003"), "postencode"):
            os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    error = worker_death_error(RuntimeError(f"DataLoader worker (pid {pid}) is killed by signal: Killed. "), str(tmp_path))
    assert isinstance(error, WorkerDiedError) and error.samples[0]["key"] == "sample00003"
    assert "exclude: ['shards/train-000001.tar#sample00003']" in str(error)
    assert str(error).startswith(f"DataLoader worker (pid {pid}) is killed by signal")


def test_a_dead_worker_that_decoded_nothing_is_named_as_such(tmp_path):
    error = worker_death_error(RuntimeError("DataLoader worker (pid(s) 123, 456) exited unexpectedly"), str(tmp_path))
    assert error.samples == [] and "pid(s) [123, 456] were decoding no sample" in str(error)


def test_other_errors_pass_unchanged(tmp_path):
    assert worker_death_error(RuntimeError("DataLoader timed out after 5 seconds"), str(tmp_path)) is None
    with pytest.raises(RuntimeError, match="^DataLoader timed out"), naming_dead_workers(str(tmp_path)):
        raise RuntimeError("DataLoader timed out after 5 seconds")


def test_a_recorder_pickles_without_its_mapping(tmp_path):
    recorder = InflightRecorder(str(tmp_path))
    with recorder.decoding(_sample(), "preencode"):
        pass
    copy = pickle.loads(pickle.dumps(recorder))
    assert copy.directory == str(tmp_path) and copy._mapping is None
