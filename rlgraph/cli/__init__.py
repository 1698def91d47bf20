"""The command line: `rlgraph compile | run | timeline | tune | export | schema` (`main`), the
run command's driver (`run`) and the tune command (`tune`)."""
