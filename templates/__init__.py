"""Jinja2 templates: the only place slurmk8s writes configuration text.

Installed as the package ``slurmk8s.templates`` so the renderer finds them in
a wheel, an editable install and a checkout alike.
"""
