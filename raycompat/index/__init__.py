"""faiss indexes beside the store: distances, search, a version's index, sharded builds (no Ray)."""
