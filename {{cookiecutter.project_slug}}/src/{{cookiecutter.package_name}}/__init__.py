"Scaled Trainer: A PyTorch training project that scales from one device to many by one flag."
