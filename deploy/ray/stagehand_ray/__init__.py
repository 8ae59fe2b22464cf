"""stagehand on Ray Serve: one `stagehand serve` per GPU, routed by model (app.py)."""
