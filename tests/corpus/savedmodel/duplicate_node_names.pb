Ì
"serve*2.99.0f
.
xPlaceholder*
dtype0*
shape:

yIdentityx*
T0

yIdentityx*
T0*Q
serving_default>

x
x:0
y
y:0tensorflow/serving/predict