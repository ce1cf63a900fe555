"""Figures (PNG, plus HTML that opens offline with one shared copy of plotly.js), tables and the
attention replay page."""
