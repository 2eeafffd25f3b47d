"""The requester's side of the bus: client (request, read, cancel, administer) and follow (one request
followed until done, as events)."""
