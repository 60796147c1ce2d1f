"""The node-lending bridge. See README.md in this folder."""
