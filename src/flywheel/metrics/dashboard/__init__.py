"""The live dashboard (`flywheel dashboard runs/`): runindex.py reads run directories incrementally, transcript.py
rebuilds readable transcripts from token ids, server.py serves the read-only API, the event stream and static/."""
