"""The graph file: graph.yaml read safely (`safe_yaml`), validated into the typed `Spec`
(`schema`), with CLI overrides and error text naming file, line and key (`load`)."""
