"""What every command shares: one-line errors and exit status (`errors`), decoding flags defined once
(`arguments`), file permissions and UTF-8 line reading (`files`), process settings for fast CPU inference
(`runtime`)."""
