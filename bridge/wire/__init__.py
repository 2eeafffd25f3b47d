"""The git wire: every git operation as a plain `git` subprocess (git), and the two protocols spoken here,
pushes (receive_pack) and objects fetched by id from a git daemon (upload_pack)."""
