"""The git wire: every git operation on a local repository as a plain `git` subprocess (git); the bus's
transport, one per bus and chosen once from its URL (transport: a path or file://, git://, ssh, http(s)); pkt-line
framing and deadline I/O, written once (pktline); and the two protocols spoken here on a transport, pushes
(receive_pack) and objects fetched by id from a git daemon (upload_pack)."""
