// Package flowcontrol releases queued requests band by band, gated by a ceiling policy that reads backend saturation.
package flowcontrol
