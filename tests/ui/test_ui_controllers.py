"""The window's controllers and the hooks review tools build on (ui/review_controller.py):
a tool widget in the review bar, a click handler that sees clicks first, the session shown."""
from PySide6 import QtWidgets

from tests.ui.conftest import wait_finished


def test_review_tools_hook_into_the_review_bar(qtbot, make_window, shared_data):
    w = make_window()
    sessions = []
    w.reviews.sessionChanged.connect(sessions.append)
    w.set_input(str(shared_data / "icl_livingroom_kt3" / "rgb"))
    w.max_frames.setValue(4)
    assert w.start_run()
    s = wait_finished(qtbot, w)
    assert s["session"] and sessions[-1] == s["session"] == w.reviews.folder == w.session_folder

    tool = QtWidgets.QPushButton("Crop")
    w.reviews.add_tool(tool)
    assert tool.parent() is w.review._tools
    qtbot.waitUntil(lambda: tool.isVisibleTo(w), timeout=2000)     # shown with the bar
    row = w.review._tools.layout()
    assert row.indexOf(tool) == row.indexOf(w.review.info) - 1      # before the info label

    seen = []
    w.reviews.add_click_handler(lambda pos: seen.append(tuple(pos)) or len(seen) == 1)
    from ui.review import project
    xy, _ = project(w.viewer, w.viewer.scene.camera_centers()[-1:])
    w.review.clicked_index = None
    w.review.click(xy[0])                       # the tool takes the first click: no camera pick
    assert len(seen) == 1 and w.review.clicked_index is None
    w.review.click(xy[0])                       # it declines the second: the camera is picked
    assert len(seen) == 2 and w.review.clicked_index is not None

    w.review.scrub_to(1)
    assert w.reviews.reviewing and w.reviews.shown_upto() == 1 and w.export_options()["until"] == 1
    w.review.go_live()
    assert w.reviews.shown_upto() is None and "until" not in w.export_options()
    n = len(sessions)
    assert w.start_run()                        # a new run: no session until its worker opens one
    s2 = wait_finished(qtbot, w)
    assert sessions[n:] == ["", s2["session"]] and s2["session"] != s["session"]
