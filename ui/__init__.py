"""ReconStudio desktop application (Qt widgets). A client of the engine's public API only.

Modules: `viewer` (vispy point-cloud view), `worker` (engine thread), `settings_panel`,
`source_panel`, `monitors` (pyqtgraph), `main_window` (layout and wiring; the work in
`run_controller`, `session_controller`, `export_controller`, `review_controller`), `display`
(results → viewer packets).
Only the GUI thread touches widgets or GL; the engine runs in `worker.EngineWorker` on a QThread.
"""
