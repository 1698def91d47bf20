"""Everything graph.yaml names by a word, and the constants the cost model reads: GPU presets
(`gpus`), model presets and shapes (`models`), cited efficiency factors (`costs`)."""
