"""Figures (PNG plus self-contained HTML), tables and the attention replay page."""
