package main

func runUp(args []string) error { return errNotYet }
