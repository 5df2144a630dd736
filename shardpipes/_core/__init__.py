"""Torch-free building blocks: brace expansion, tar parsing, grouping, the splitter."""
