"""What the network does: socket observation of the streams under test."""
