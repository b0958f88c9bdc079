"""The package's version: the one place it is written (pyproject.toml reads it from here), below every
layer, so modules that report it (the Hub client's user agent, the model card) need not import the
package face."""

__version__ = "0.1.0"
