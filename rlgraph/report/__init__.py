"""What users read: the terminal summary, the timeline (Perfetto JSON, HTML, PNG) and the
Chrome-trace events both are drawn from."""
