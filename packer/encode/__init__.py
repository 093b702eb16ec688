"""Texts and records -> token ids (+ a loss mask), below both the build and the training side.

tokenizer.py finds, loads and configures a tokenizer once; text.py is THE text path; records.py,
offsets.py, chat.py and chat_turns.py turn fine-tuning records into ids and a mask; engines/ holds
the encode engines (`hf`, HuggingFace tokenizers, is the reference). No torch, no file formats.
"""
