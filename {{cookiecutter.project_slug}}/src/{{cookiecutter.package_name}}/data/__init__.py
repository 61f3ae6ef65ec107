"""Where samples come from: loading (the batch arithmetic), generated data, token data, files, streaming."""
