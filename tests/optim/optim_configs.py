"""The optimizer configurations the masked-gradient tests compare with torch's: each
``name -> (ms.optim class, torch.optim class, arguments)``, covering decay, amsgrad,
maximize, momentum, dampening and Nesterov."""

import torch

import masked_sparse as ms

CONFIGS = {
    "adam": (ms.optim.Adam, torch.optim.Adam, dict(lr=0.05)),
    "adam-decay-amsgrad-max": (ms.optim.Adam, torch.optim.Adam,
                               dict(lr=0.05, weight_decay=0.1, amsgrad=True, maximize=True)),
    "adamw": (ms.optim.AdamW, torch.optim.AdamW, dict(lr=0.05, weight_decay=0.1)),
    "sgd": (ms.optim.SGD, torch.optim.SGD, dict(lr=0.1)),
    "sgd-momentum-decay": (ms.optim.SGD, torch.optim.SGD,
                           dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    "sgd-nesterov-max": (ms.optim.SGD, torch.optim.SGD,
                         dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True)),
    "adagrad": (ms.optim.Adagrad, torch.optim.Adagrad,
                dict(lr=0.1, lr_decay=0.01, weight_decay=0.1, initial_accumulator_value=0.1)),
}
