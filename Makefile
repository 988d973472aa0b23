# Two entry points (see README): `make run` sets up and opens the app on the bundled sample clip,
# `make test` sets up and runs the whole test suite under a virtual X server.
.PHONY: setup run test

setup:
	@bash scripts/setup.sh

run: setup
	.venv/bin/reconstudio gui --input resources/sample/icl_livingroom_kt3.mp4 --autostart

test: setup
	# engine tests with Qt imports blocked: proves the engine works with no Qt installed
	RECONSTUDIO_BLOCK_QT=1 .venv/bin/python -m pytest -q -p no:pytest-qt tests/engine
	QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python -m pytest -q tests/ui
