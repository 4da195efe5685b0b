"""The upgrade job on Ray: the history driver (:mod:`.job`), its stages and publishing actions."""
