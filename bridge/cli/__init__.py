"""The front ends, which nothing imports: main (`kakeya ...`, one module per verb under commands/) and mcp
(the Model Context Protocol server)."""
