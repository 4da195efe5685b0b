"""The report folder: an earlier report moves aside whole, never half overwritten."""

import os

from raycompat.upgrade.report_folder import EARLIER, archive, has_report


def test_no_report_means_nothing_to_move(tmp_path):
    assert not has_report(tmp_path) and archive(tmp_path) is None
    assert archive(tmp_path / "missing") is None
    assert list(tmp_path.iterdir()) == []


def test_the_earlier_report_moves_whole_into_a_folder_named_by_its_utc_time(tmp_path):
    (tmp_path / "report.md").write_text("# old\n")
    (tmp_path / "backfill_m2.png").write_bytes(b"png")
    os.utime(tmp_path / "report.md", (0, 86_400 + 3_661))  # 1970-01-02 01:01:01 UTC
    moved = archive(tmp_path)
    assert moved == tmp_path / EARLIER / "19700102T010101Z"
    assert sorted(p.name for p in moved.iterdir()) == ["backfill_m2.png", "report.md"]
    assert (moved / "report.md").read_text() == "# old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [EARLIER]  # nothing stays behind


def test_two_reports_written_in_the_same_second_both_stay(tmp_path):
    for text in ("first", "second"):
        (tmp_path / "report.md").write_text(text)
        os.utime(tmp_path / "report.md", (0, 0))
        archive(tmp_path)
    folders = sorted(p.name for p in (tmp_path / EARLIER).iterdir())
    assert folders == ["19700101T000000Z", "19700101T000000Z-2"]
    assert (tmp_path / EARLIER / folders[1] / "report.md").read_text() == "second"
