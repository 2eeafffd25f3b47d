"""The ground: what every layer above may use, importing nothing of the bridge but itself.

errors (errors a user can act on, and their exit codes), names (the name rules), text (run-written text
made safe to show), caps (what a runner may read and commit of what a run left), logs (redaction and capped
logs), result (result.json's model).
"""
