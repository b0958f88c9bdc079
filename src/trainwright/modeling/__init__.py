"""What the Trainer applies to a model: the loss contract, NEFTune, Liger, the underflow detector, `past_index`."""
