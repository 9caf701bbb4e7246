"""Ragged items that select rows of a larger table, and the BigFile pieces."""

import numpy as np
import pytest

from prvr.datasets.real.bigfile import BigFile, MappedRows, parse_video2frames, write_bigfile
from prvr.datasets.real.problems import LayoutError
from prvr.datasets.types import Ragged


def test_ragged_rows_select_any_rows_in_any_order():
    data = np.arange(20.0).reshape(10, 2)
    r = Ragged(data, [0, 3, 3, 5, 7], rows=[4, 5, 6, 9, 1, 2, 3])
    np.testing.assert_array_equal(r[0], data[4:7])
    assert r[1].shape == (0, 2)
    np.testing.assert_array_equal(r[2], data[[9, 1]])
    np.testing.assert_array_equal(r[3], data[2:4])
    assert np.shares_memory(r[0], data)  # one ascending run: a slice, no copy
    assert r.lengths.tolist() == [3, 0, 2, 2] and r.dim == 2
    compact = r.in_memory()
    assert compact.rows is None
    for i in range(len(r)):
        np.testing.assert_array_equal(compact[i], r[i])


def test_ragged_checks_rows_and_keeps_the_old_contract():
    data = np.zeros((4, 3))
    with pytest.raises(ValueError, match="len\\(rows\\)"):
        Ragged(data, [0, 2], rows=[0, 1, 2])
    with pytest.raises(ValueError, match="index rows of data"):
        Ragged(data, [0, 1], rows=[4])
    with pytest.raises(ValueError, match="end at len\\(data\\)"):
        Ragged(data, [0, 3])
    assert Ragged(data, [0, 1, 4])[1].shape == (3, 3)


def test_video2frames_is_parsed_as_data(tmp_path):
    path = tmp_path / "video2frames.txt"
    path.write_text("{'a': ['a_0', 'a_1'],\n 'b': ('b_0',)}\n")
    assert parse_video2frames(path, 1000) == {"a": ["a_0", "a_1"], "b": ["b_0"]}
    path.write_text("{'a': ['a_0'],\n 'b': [1, 2]}\n")
    with pytest.raises(LayoutError, match="line 2 key 'b': a frame id is a int constant, not a quoted string"):
        parse_video2frames(path, 1000)
    path.write_text("{'a': ['a_0'], 'a': ['a_1']}")
    with pytest.raises(LayoutError, match="key 'a': video id listed twice"):
        parse_video2frames(path, 1000)
    with pytest.raises(LayoutError, match=r"bytes, more than 10 \(video2frames.txt lists each frame id"):
        parse_video2frames(path, 10)


def test_bigfile_maps_frames_of_videos_stored_out_of_order(tmp_path):
    rows = np.arange(5 * 4, dtype=np.float32).reshape(5, 4)
    v2f = {"x": ["f3", "f4"], "y": ["f0", "f2", "f1"]}  # y's frames are not consecutive rows
    write_bigfile(tmp_path, ["f0", "f1", "f2", "f3", "f4"], [rows[:2], rows[2:]], 4, v2f)
    big = BigFile(tmp_path)
    from prvr.datasets.real.problems import Report

    x, y = big.video_rows("x", Report()), big.video_rows("y", Report())
    frames = Ragged(big.data, [0, 2, 5], rows=np.concatenate([x, y]))
    np.testing.assert_array_equal(frames[0], rows[3:5])
    np.testing.assert_array_equal(frames[1], rows[[0, 2, 1]])
    assert isinstance(big.data, MappedRows) and big.nonfinite_rows().size == 0
